"""Diagnostic (session 46): tests/gpu/test_stack_rebuild_beside.py with record_stream made a no-op must fail."""
import sys
import torch
sys.path.insert(0, "tests/gpu")
torch.Tensor.record_stream = lambda self, s: None
import test_stack_rebuild_beside as t
try:
    t.test_rebuild_on_a_side_stream_reads_the_old_weights()
    print("record_stream off: the rebuild test passed (not sensitive)")
except AssertionError:
    print("record_stream off: the rebuild test FAILED, as it should")
