"""Schedulers and machines: SLURM and PBS, profiles, preflight, `tacl submit`, one machine's GPUs, the handlers."""

# Nothing imported here: tacl.runtime.scheduler stands below the stages, which may import it without the rest.
