"""SLURM: checks before anything is submitted, and `tacl submit` (submitit) for single stages."""
