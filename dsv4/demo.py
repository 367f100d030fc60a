"""`make demo`: generate text with the tiny DeepSeek-V4 model shipped inside the package."""
from __future__ import annotations

import sys

from dsv4.cli import main as cli

PROMPTS = ["The for statement", "A class definition", "Exceptions are"]


def main() -> int:
    args = ["generate", "--max-tokens", "48", "--temperature", "0.7", "--top-p", "0.9", "--seed", "1",
            "--no-stream", *PROMPTS]
    print(f"$ dsv4 {' '.join(repr(a) if ' ' in a else a for a in args)}", flush=True)
    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
