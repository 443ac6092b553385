"""When must a chunk stop? The earliest of: an explicit deadline, SLURM's or PBS's own end time for this job,
the runtime the rule gave; and at once when SIGUSR1, SIGUSR2 or SIGTERM arrives (saved at the next step
boundary)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field

_LEFT = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def parse_time_left(text: str) -> float | None:
    """squeue's %L ("1-02:03:04", "02:03:04", "03:04"); None for UNLIMITED / NOT_SET / INVALID."""
    m = _LEFT.match(text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def slurm_time_left() -> float | None:
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_time_left(out.splitlines()[0]) if out.strip() else None


def end_time(start: float, deadline: float | None = None, runtime_minutes: float | None = None) -> float | None:
    """Unix time by which the job is gone, from every source known; None if there is no limit."""
    candidates = []
    if deadline:
        candidates.append(deadline)
    if runtime_minutes:
        candidates.append(start + 60.0 * runtime_minutes)
    from tacl.cluster.pbs import pbs_time_left

    for left in (slurm_time_left(), pbs_time_left()):
        if left is not None:
            candidates.append(time.time() + left)
    return min(candidates) if candidates else None


@dataclass
class StopSignals:
    """SIGUSR1, SIGUSR2 (submitit's timeout signal) and SIGTERM set a flag; the trainer saves at the next
    optimizer step and exits 0."""

    received: list[int] = field(default_factory=list)

    def install(self) -> "StopSignals":
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        self.received.append(signum)

    @property
    def stop(self) -> bool:
        return bool(self.received)


@dataclass
class Deadline:
    end: float | None
    margin_s: float
    step_s: float = 0.0
    save_s: float = 0.0

    def observe_step(self, seconds: float) -> None:
        self.step_s = seconds if self.step_s == 0 else 0.8 * self.step_s + 0.2 * seconds

    def near(self, now: float | None = None) -> bool:
        """Would one more step plus a save run past end - margin?"""
        if self.end is None:
            return False
        now = time.time() if now is None else now
        return now + 1.5 * self.step_s + self.save_s > self.end - self.margin_s
