"""When must a chunk stop? The earliest of: an explicit deadline, SLURM's or PBS's own end time for this job
(asked through tacl.runtime.scheduler, the scheduler queries below the stages and the rest of tacl.cluster), the
runtime the rule gave; and at once when SIGUSR1, SIGUSR2 or SIGTERM arrives (tacl.runtime.signals: saved at the
next step boundary)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from tacl.runtime.scheduler import time_left


def end_times(start: float, deadline: float | None = None,
              runtime_minutes: float | None = None) -> dict[str, float]:
    """Unix time by which the job is gone, per source that knows one: the explicit deadline, the runtime the
    rule gave (from `start`), the scheduler's own end time for this job (tacl.runtime.scheduler.time_left)."""
    ends = {}
    if deadline:
        ends["--deadline"] = deadline
    if runtime_minutes:
        ends[f"runtime {runtime_minutes:g} min"] = start + 60.0 * runtime_minutes
    left = time_left()
    if left is not None:
        ends[scheduler_source()] = time.time() + left
    return ends


def end_time(start: float, deadline: float | None = None,
             runtime_minutes: float | None = None) -> float | None:
    """The earliest of end_times(); None if there is no limit."""
    return min(end_times(start, deadline, runtime_minutes).values(), default=None)


def scheduler_source() -> str:
    """Which scheduler's job this is, as the chunk's log names it."""
    if os.environ.get("SLURM_JOB_ID"):
        return f"squeue, SLURM job {os.environ['SLURM_JOB_ID']}"
    return f"qstat, PBS job {os.environ.get('PBS_JOBID', '?')}"


def describe(ends: dict[str, float]) -> str:
    """'ends 2026-11-24T10:00:00 (squeue, SLURM job 7; runtime 5 min 2026-11-24T10:00:40)': the earliest end
    first, in local time as scontrol prints it, then the other sources."""
    if not ends:
        return "no end time (no scheduler limit, no runtime, no deadline)"
    first, *others = sorted(ends, key=ends.get)
    return f"ends {_stamp(ends[first])} ({'; '.join([first] + [f'{k} {_stamp(ends[k])}' for k in others])})"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


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
