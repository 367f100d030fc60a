"""DeepSeek-V4 checkpoints: naming table, validating loader, official-format writer, inspect."""
from dsv4.checkpoint.errors import CheckpointError
from dsv4.checkpoint.loader import Checkpoint, load_state
from dsv4.checkpoint.naming import TensorSpec, expected_inventory
from dsv4.checkpoint.writer import random_master_weights, tiny_config, write_checkpoint

__all__ = ["CheckpointError", "Checkpoint", "load_state", "TensorSpec", "expected_inventory",
           "random_master_weights", "tiny_config", "write_checkpoint"]
