"""`make demo` (temporary): write a random tiny checkpoint to a temp dir and run `dsv4 inspect` on it."""
from __future__ import annotations

import sys
import tempfile

from dsv4.cli import main as cli


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dsv4-demo-") as tmp:
        for args in (["make-tiny", tmp, "--seed", "0"], ["inspect", tmp]):
            print(f"$ dsv4 {' '.join(args)}", flush=True)
            rc = cli(args)
            if rc:
                return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
