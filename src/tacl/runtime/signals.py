"""The scheduler's stop signals, caught from a trainer's first instruction to its exit.

SLURM's warning before the time limit (`--signal=USR1@600` in profiles/slurm, sent to every process of the
job), submitit's SIGUSR2, the SIGTERM at the limit (SLURM and PBS alike) and the SIGTERM a seed gets when its
job's process dies all say one thing: save what can be saved, and stop. A process that trains (`tacl pretrain
train`, `tacl finetune glue|squad|ner`) calls `catch` before anything else (tacl.__main__): from then until it
exits such a signal is recorded here, never fatal, and each phase of the work reads the record at its own
safe points:

- before training starts (loading, tokenizing, compiling): it stops there; nothing new was trained, so
  nothing is saved, and a checkpoint from before stays as it was;
- between training steps: it saves its checkpoint and stops (tacl.pretrain.trainer, tacl.finetune.common);
- after the last step, while it predicts: it saves the trained state and stops; run again, it predicts from
  that state without training again (tacl.finetune.resume.Checkpointing.stop_point);
- while it writes its results, and after: it finishes (seconds), and exits as it would have.

A process started by a trainer (the seeds of a fine-tuning job side by side, tacl.finetune.side_by_side) has
the signals blocked from before its first instruction (`block`, between fork and exec: the blocked set
survives exec) until its own `catch` unblocks them: a signal sent meanwhile waits and is recorded then, and
none kills the process while it imports. At exit the signals are ignored (`catch` registers it with atexit):
Python restores their default action, termination, while the interpreter shuts down, and a late warning
would turn a finished process into one killed by a signal.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# The commands that train (`tacl STAGE COMMAND`): they catch the stop signals first thing (tacl.__main__)
TRAINERS = (["pretrain", "train"], ["finetune", "glue"], ["finetune", "squad"], ["finetune", "ner"])
_received: list[int] = []  # (one process, one record: what the handler below appends, in arrival order)
_caught: list[bool] = []


def _record(signum: int, frame) -> None:
    _received.append(signum)


def _ignore() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def catch() -> bool:
    """Record the stop signals from now until this process exits, unblocking any that its parent blocked
    (`block`): one that arrived meanwhile is recorded now. False (nothing changed) outside the main thread,
    where Python sets no handler."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if not _caught:
        atexit.register(_ignore)
        _caught.append(True)
    return True


def caught() -> bool:
    """Whether `catch` runs in this process: the stop signals are recorded, not fatal."""
    return bool(_caught) and all(signal.getsignal(sig) is _record for sig in STOP_SIGNALS)


def block() -> None:
    """Block the stop signals in this thread (and in a program it execs): what a trainer's child runs between
    fork and exec, so that a signal waits for the child's own `catch`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def received() -> list[int]:
    """The stop signals received since `catch`, in arrival order (a copy)."""
    return list(_received)


def stop_requested() -> bool:
    return bool(_received)


def first() -> str | None:
    """'SIGUSR1': the first stop signal received, by name (None: none)."""
    return signal.Signals(_received[0]).name if _received else None


def forget() -> None:
    """Forget the signals received (a test that sends itself one, and the next that should not see it)."""
    _received.clear()


@contextlib.contextmanager
def catching() -> Iterator[None]:
    """The block runs with the stop signals caught: where the process catches them already (a trainer's
    command), nothing changes; otherwise (a test that calls a trainer's function) they are caught for the
    block alone, the handlers before put back after it and the signals it received forgotten."""
    if caught():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    if not catch():
        yield
        return
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        forget()


class StopSignals:
    """The record as the pretraining loop reads it (`stop`); `install` is `catch`."""

    def install(self) -> "StopSignals":
        catch()
        return self

    @property
    def received(self) -> list[int]:
        return received()

    @property
    def stop(self) -> bool:
        return stop_requested()
