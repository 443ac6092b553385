#!/usr/bin/env bash
# Wheels for a node without internet whose Python already has PyTorch (a CUDA node's own Python or image):
# one wheel per package that envs/requirements-cuda.txt resolves to, for that node's Python, so that it
# installs there with no package index (README: Checking a GPU node).
#
#   envs/offline-wheels.sh OUT_DIR [PYTHON_VERSION] [LEAVE_OUT]
#
# PYTHON_VERSION: the node's Python (default 3.12; Linux x86-64, manylinux). LEAVE_OUT: packages the node
# already has and may keep, or that no run there needs (comma-separated names, or a file of
# `pip list --format=freeze` lines).
# Always left out: torch, triton and the nvidia-* and cuda-* libraries (the node's own). Never left out,
# whatever LEAVE_OUT says: the transformers family (transformers, tokenizers, huggingface-hub, safetensors):
# the code is written against transformers 5 (every forward passes a 4-D boolean attention mask, which 4.x
# refuses with "Wrong shape"; its tokenizer and attention interfaces changed too), and these four only work
# as a matched set, so the pinned ones always ship; first on PYTHONPATH, they take precedence over the node's.
#
# A package with a binary wheel for PYTHON_VERSION is downloaded as it is; one published only as a source
# archive (deepspeed 0.19.8, seqeval 1.2.2, connection_pool 0.0.3) is built here into a pure-Python wheel
# (`pip wheel --no-deps`: DeepSpeed builds no op at install, and needs none at run time on a GPU with torch's
# AdamW); a source archive that would build platform code stops the script, naming it.
# Run from the repository root, with internet, with a Python >= 3.11 that has pip ($PYTHON, default the
# checkout's .venv, else python3). On the node:
#   python3 -m pip install --no-index --no-deps --target SITE OUT_DIR/*.whl && export PYTHONPATH=SITE
# (benchmarks/gpu_check.sh does this with TACL_WHEELS=OUT_DIR).
set -euo pipefail
out=${1:?usage: envs/offline-wheels.sh OUT_DIR [PYTHON_VERSION] [LEAVE_OUT]}
version=${2:-3.12}
leave_out=${3:-}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi
pip=(${PIP:-$py -m pip})
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -vE '^\s*(#|$)' envs/requirements-cuda.txt | grep -viE '^torch\s*(==|>|<|$)' > "$tmp/requirements.txt"
"${pip[@]}" install -q --dry-run --ignore-installed --report "$tmp/report.json" -r "$tmp/requirements.txt"
"$py" - "$tmp/report.json" "$leave_out" > "$tmp/wanted.txt" <<'PY'
import json
import os
import re
import sys

report, leave_out = sys.argv[1], sys.argv[2]


def norm(name):
    return re.sub(r"[-_.]+", "-", name.strip().lower())


if os.path.isfile(leave_out):
    leave_out = open(leave_out).read()
names = [re.split(r"[=<>~! ]", item.strip())[0] for item in re.split(r"[,\n]", leave_out) if item.strip()]
family = {"transformers", "tokenizers", "huggingface-hub", "safetensors"}
leave = ({norm(n) for n in names} - family) | {"torch", "triton"}
for item in json.load(open(report))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if norm(name) not in leave and not norm(name).startswith(("nvidia-", "cuda-")):
        print(f"{name}=={version}")
PY
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64
do platforms+=(--platform "$tag")
done
built=0
while read -r spec; do
    if "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
            "${platforms[@]}" -d "$out" "$spec" 2> "$tmp/download.log"; then
        continue
    fi
    rm -rf "$tmp/built" && mkdir "$tmp/built"
    "${pip[@]}" wheel -q --no-deps -w "$tmp/built" "$spec" > "$tmp/build.log" 2>&1 \
        || { echo "offline-wheels: $spec has no wheel for Python $version and did not build:" >&2
             tail -5 "$tmp/download.log" "$tmp/build.log" >&2; exit 1; }
    wheel=$(ls "$tmp/built"/*.whl)
    case "$wheel" in
        *-none-any.whl) mv "$wheel" "$out/" && built=$((built + 1)) ;;
        *) echo "offline-wheels: $spec has no wheel for Python $version, and its source builds platform code" \
                "($(basename "$wheel")): build it on a machine like the node" >&2; exit 1 ;;
    esac
done < "$tmp/wanted.txt"
echo "offline-wheels: $(wc -l < "$tmp/wanted.txt") packages for Python $version in $out ($built built here" \
     "from source archives), $(du -sh "$out" | cut -f1)"
