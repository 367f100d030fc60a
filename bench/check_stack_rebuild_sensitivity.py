"""Diagnostic (session 46): tests/gpu/test_stack_rebuild_beside.py's rebuild test with `record_stream` made a
no-op (the fix undone) must fail -- the check that the test can see the race at all."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).parent.parent


def main() -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gpu")]
    torch.Tensor.record_stream = lambda self, stream: None
    import test_stack_rebuild_beside as t
    try:
        t.test_rebuild_on_a_side_stream_reads_the_old_weights()
    except AssertionError:
        print("record_stream off: the rebuild test FAILED, as it should")
        return
    print("record_stream off: the rebuild test passed (it does not see the race)")


if __name__ == "__main__":
    main()
