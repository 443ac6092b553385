"""Data stage: raw Wikipedia -> clean sentences -> NSP instances -> verified binary shards."""
