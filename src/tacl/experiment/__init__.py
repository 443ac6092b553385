"""What one experiment is, from its config: its checks, models, tasks, settings, seeds, folders, inputs and reruns."""

# Nothing imported here: tacl.runtime.layout stands below the stages, which may import it without the rest.
