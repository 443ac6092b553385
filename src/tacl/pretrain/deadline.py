"""When must a chunk stop? The earliest of: an explicit deadline, SLURM's or PBS's own end time for this job
(asked through tacl.scheduler, the scheduler queries below the stages and tacl.cluster), the runtime the rule
gave; and at once when SIGUSR1, SIGUSR2 or SIGTERM arrives (saved at the next step boundary)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from tacl.scheduler import time_left


def end_time(start: float, deadline: float | None = None, runtime_minutes: float | None = None) -> float | None:
    """Unix time by which the job is gone, from every source known; None if there is no limit."""
    candidates = []
    if deadline:
        candidates.append(deadline)
    if runtime_minutes:
        candidates.append(start + 60.0 * runtime_minutes)
    left = time_left()
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
