"""What every stage's process shares: file helpers, the device, pretrained models, run locks, an encoder's size."""
