"""TACO's similarities: the 1 + K per anchor gathered (ours now, `tacl.objectives.taco.taco_loss`) against
the full [B*L, B*L] matrix they were gathered from before, in one run on the same inputs.

Inputs: g = normalize(h - e) for a BERT-base micro-batch (B 32 x L 256, hidden 768, fp32, as the loss
sees it), sequence lengths drawn around the shared Wikipedia sample's mean of 160, pairs from
`sample_taco_pairs` (window 2, K 50). Timed: the loss forward and its backward to g, each way, alternating,
the best of --repeats. Memory: on a GPU the peak allocated above the inputs (torch.cuda.max_memory_allocated);
on the CPU the peak resident memory above the inputs (Linux's VmHWM, reset before each way through
/proc/self/clear_refs).
Also printed: the largest difference in loss and gradient between the two (fp32 sums in another order).

    python benchmarks/taco_similarities.py [--gpu] [--batch 32] [--length 256] [--hidden 768] [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from tacl.objectives import counts, in_fp32  # noqa: E402
from tacl.objectives.mlm_nsp import IGNORE_INDEX  # noqa: E402
from tacl.objectives.taco import sample_taco_pairs, taco_loss  # noqa: E402


@in_fp32
def full_matrix_loss(g: torch.Tensor, valid: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor,
                     tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """taco_loss as it was before: every similarity of the micro-batch, then the 1 + K of each anchor."""
    bsz, length, hidden = g.shape
    flat = g.reshape(bsz * length, hidden)
    sims = flat @ flat.detach().T  # [B*L, B*L]
    own = (torch.arange(bsz, device=g.device)[:, None] * length + positive).reshape(-1, 1)
    columns = torch.cat([own, negatives.reshape(bsz * length, -1)], 1)
    logits = sims.gather(1, columns).float() / tau
    anchors = valid.flatten()
    target = torch.where(anchors, 0, IGNORE_INDEX)
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss / anchors.sum().clamp(min=1), counts(logits.argmax(-1) == 0, anchors)


WAYS = {"full matrix (before)": full_matrix_loss, "gathered (now)": taco_loss}


def inputs(batch: int, length: int, hidden: int, device: str):
    gen = torch.Generator().manual_seed(0)
    lengths = (160 + 50 * torch.randn(batch, generator=gen)).round().clamp(16, length).long()
    valid = torch.arange(length)[None, :] < lengths[:, None]
    g = F.normalize(torch.randn(batch, length, hidden, generator=gen), dim=-1)
    positive, negatives, has = sample_taco_pairs(valid, 2, 50, torch.Generator().manual_seed(1))
    return [t.to(device) for t in (g, valid & has[:, None], positive, negatives)]


def run(way: str, g, valid, positive, negatives) -> tuple[torch.Tensor, torch.Tensor]:
    x = g.detach().requires_grad_(True)
    loss, _ = WAYS[way](x, valid, positive, negatives, 0.07)
    loss.backward()
    return loss.detach(), x.grad


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_mb(way: str, device: str, g, valid, positive, negatives) -> float:
    """The peak memory of one forward + backward above what was in use before it."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run(way, g, valid, positive, negatives)
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    def high_water() -> float:
        return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024

    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to the current resident size
    base = high_water()
    run(way, g, valid, positive, negatives)
    return high_water() - base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = "cuda" if args.gpu else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as the trainer (tacl.runtime.device.fast_fp32_matmul)
    shape = (args.batch, args.length, args.hidden)
    g, valid, positive, negatives = inputs(*shape, device)
    n = args.batch * args.length
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"TACO similarities, B {args.batch} x L {args.length} (N = {n} positions, "
          f"{int(valid.sum())} anchors), hidden {args.hidden}, K 50, fp32; {where}")
    results = {way: run(way, g, valid, positive, negatives) for way in WAYS}  # (also the warm-up)
    times = {way: [] for way in WAYS}
    for _ in range(args.repeats):
        for way in WAYS:
            sync(device)
            t0 = time.perf_counter()
            run(way, g, valid, positive, negatives)
            sync(device)
            times[way].append(time.perf_counter() - t0)
    peaks = {way: peak_mb(way, device, g, valid, positive, negatives) for way in WAYS}
    kind = "peak allocated above the inputs" if device == "cuda" else "peak resident above the inputs"
    for way in WAYS:
        print(f"   {way:22s} forward + backward {1000 * min(times[way]):8.1f} ms   {kind} {peaks[way]:8.1f} MB")
    before, now = WAYS
    print(f"   gathered / full matrix: {min(times[now]) / min(times[before]):.3f}x the time, "
          f"{peaks[now] / max(peaks[before], 1e-9):.3f}x the memory")
    (l0, g0), (l1, g1) = results[before], results[now]
    print(f"   |loss difference| {abs(float(l0) - float(l1)):.2e} (loss {float(l1):.4f}); largest |gradient "
          f"difference| {float((g0 - g1).abs().max()):.2e} (largest |gradient| {float(g1.abs().max()):.2e})")


if __name__ == "__main__":
    main()
