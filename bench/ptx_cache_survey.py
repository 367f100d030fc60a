"""Global load / store widths of every kernel in a Triton cache directory (the kernels a run compiled), from their
PTX: which kernels store (or load) 16 or 8 bits at a time, where 16-byte vectors may have been meant (session 32:
a 16-bit store pattern cost the MoE call 29 %). Run a workload with TRITON_CACHE_DIR set to an empty folder, then

    python bench/ptx_cache_survey.py DIR [--all]

One line per compiled kernel variant: name, warps, then its loads and stores by width; narrow ones first. PTX
repeats a load once per replicated element (a [rows, chunks, 1] scale tile in a 16-wide layout: 16 byte loads of
one address) and ptxas merges those; check a suspect in SASS (`bench/sass_stats.py CASE --grep LDG`) before acting.
Session 32 (s32g): attention's 64 PTX byte loads were 4 LDG.U8 in SASS; `_prefill_scores_kernel`'s 16-bit stores
come from its variant for a row stride not divisible by 16 (prompts whose entry count is not).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re

NARROW = re.compile(r"\.(b8|b16|u8|u16|s8|s16)$")


def survey(cache_dir: str):
    """[(name, num_warps, Counter of ld/st.global widths)] for each kernel variant under cache_dir."""
    out = []
    for ptx_path in sorted(glob.glob(os.path.join(cache_dir, "*", "*.ptx"))):
        meta_path = ptx_path[:-4] + ".json"
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        with open(ptx_path) as f:
            ptx = f.read()
        ops = collections.Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*)", ptx))
        out.append((meta.get("name", os.path.basename(ptx_path)), meta.get("num_warps", "?"), ops))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache_dir")
    ap.add_argument("--all", action="store_true", help="also list kernels without narrow global accesses")
    args = ap.parse_args()
    rows = survey(args.cache_dir)
    narrow = lambda ops: sum(n for op, n in ops.items() if NARROW.search(op) and op.startswith("st."))  # noqa: E731
    rows.sort(key=lambda r: -narrow(r[2]))
    print(f"{len(rows)} kernel variants in {args.cache_dir}")
    for name, warps, ops in rows:
        if args.all or any(NARROW.search(op) for op in ops):
            print(f"{name[:44]:44s} w{warps}: " + ", ".join(f"{op.replace('.global', '')} {n}"
                                                         for op, n in sorted(ops.items())))


if __name__ == "__main__":
    main()
