"""`python -m tacl`: a trainer's command (tacl.runtime.signals.TRAINERS) catches the scheduler's stop signals
before anything else is imported."""

import sys

from tacl.runtime import signals

if sys.argv[1:3] in signals.TRAINERS:
    signals.catch()

from tacl.cli import main  # noqa: E402 (after the signals are caught)

sys.exit(main())
