"""Data stage: raw Wikipedia -> clean sentences -> NSP instances -> verified binary shards."""

# a padded micro-batch's host flag (a Python bool), set by the loader (tacl.data.pretraining): every row fills
# its width, so its attention runs without a mask (tacl.objectives.sdpa_mask); a packed one has no such flag.
# Here, where the objectives read it without loading torch or numpy
NO_PADDING = "no_padding"
