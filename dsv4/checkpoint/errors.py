"""The one exception the checkpoint package raises for bad checkpoints."""
from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded as-is; the message names the file and tensor."""
