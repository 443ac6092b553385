"""A pretraining run directory's checkpoint folders, and what killed processes leave unfinished there; light to
import (`tacl status` reads it on a login node).

`checkpoints/<tag>/`: a complete checkpoint (tacl.pretrain.checkpoint); `checkpoints/.incoming/<tag>/`: a save
being written, renamed into place once complete; `<tag>/universal/<tag>.incoming`: a conversion to DeepSpeed's
universal format being written; `<tag>.damaged-<time>`: a damaged checkpoint set aside (kept).

A process killed while it writes leaves what it wrote unfinished (`leftovers`): a save in `.incoming/`, a
conversion's `<tag>.incoming`, a file written under a temporary name (tacl.runtime.io.atomic_path: run.json, `latest`,
metrics.jsonl). Nothing reads them; a BERT-base save is about 1.5 GB, and a job preempted or requeued again and
again would leave one per kill. The next chunk removes them when it starts (`clear_leftovers`), holding the
run's lock, which tells that no live trainer writes there, before it saves.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tacl.runtime.io import remove_leftovers, temporaries_under

CHECKPOINTS = "checkpoints"
INCOMING = ".incoming"
UNIVERSAL = "universal"
DAMAGED = ".damaged-"  # a damaged checkpoint set aside: `<tag>.damaged-<time>` (not a tag: never pruned or loaded)
log = logging.getLogger("tacl.pretrain")


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS


def leftovers(run_dir: str | os.PathLike) -> list[Path]:
    """What killed processes left unfinished in a run directory: everything in `checkpoints/.incoming/`, every
    `<tag>/universal/<tag>.incoming`, and the files and folders written under a temporary name that no process
    still running on this host writes (tacl.runtime.io.temporaries_under)."""
    root = checkpoint_dir(run_dir)
    found = sorted((root / INCOMING).iterdir()) if (root / INCOMING).is_dir() else []
    found += sorted(root.glob(f"*/{UNIVERSAL}/*{INCOMING}"))
    return found + [p for p in temporaries_under(run_dir) if not any(p.is_relative_to(q) for q in found)]


def clear_leftovers(run_dir: str | os.PathLike) -> int:
    """Remove what earlier processes left unfinished in the run directory (`leftovers`), with one warning naming
    each and its size; returns the bytes freed. Rank 0 of a chunk only, holding the run's lock, before it writes
    anything."""
    return remove_leftovers(leftovers(run_dir), run_dir, "killed saves and writes", log)
