"""Module flags set from the command line, for A/Bs of opt-in kernel variants in one device call.

    python bench/flags.py dsv4.kernels.moe_wide.DOWN_ONE_WARPGROUP=True -- bench/bench_parallel.py --layers 8 ...

runs the script in this process after setting each `module.NAME=value` (a Python literal; the attribute must
exist). `apply` is the same for other bench scripts (bench_moe_flags.py).
"""
from __future__ import annotations

import ast
import importlib
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def apply(settings: list[str]) -> dict[str, object]:
    """Set `pkg.module.NAME=literal` for each entry; returns the previous values (to restore)."""
    old = {}
    for item in settings:
        target, sep, text = item.partition("=")
        mod_name, _, name = target.rpartition(".")
        if not sep or not mod_name:
            raise SystemExit(f"flags: expected module.NAME=value, got {item!r}")
        mod = importlib.import_module(mod_name)
        if not hasattr(mod, name):
            raise SystemExit(f"flags: {mod_name} has no attribute {name!r}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise SystemExit(f"flags: {item!r}: the value must be a Python literal") from None
        old[item] = (mod, name, getattr(mod, name))
        setattr(mod, name, value)
    return old


def restore(old: dict[str, object]) -> None:
    for mod, name, value in reversed(list(old.values())):
        setattr(mod, name, value)


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    apply(argv[:cut])
    script, *args = argv[cut + 1:]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
