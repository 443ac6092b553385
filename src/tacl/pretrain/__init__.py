"""Continual pretraining on a DeepSpeed engine: deadline-aware chunks that resume exactly."""
