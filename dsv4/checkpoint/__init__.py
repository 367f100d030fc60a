"""DeepSeek-V4 checkpoints: naming table, validating loader, official-format writer, inspect."""
from dsv4.checkpoint.errors import CheckpointError
from dsv4.checkpoint.loader import Checkpoint, load_state
from dsv4.checkpoint.naming import TensorSpec, expected_inventory

__all__ = ["CheckpointError", "Checkpoint", "load_state", "TensorSpec", "expected_inventory"]
