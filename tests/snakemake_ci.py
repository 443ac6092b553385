"""`python -m snakemake` for the tests on the CI's SLURM clusters (profiles/slurm-ci): the SLURM executor
checks its jobs at the profile's interval (`seconds-between-status-checks`, 3 s) throughout. The plugin
otherwise adds 10 s to the interval after every check that finds no job finished (up to 180 s, which suits
jobs of hours), so a test job of seconds waited up to half a minute to be seen as finished, on every step of
the chain. Nothing else changes: what Snakemake submits, and the jobs themselves, are the plugin's."""

from snakemake.cli import main
from snakemake_executor_plugin_slurm import Executor


def profile_interval(executor) -> int:
    return executor.workflow.remote_execution_settings.seconds_between_status_checks


assert isinstance(Executor.next_seconds_between_status_checks, property), "the plugin's interval moved: update this"
Executor.next_seconds_between_status_checks = property(profile_interval, lambda executor, value: None)

if __name__ == "__main__":
    main()
