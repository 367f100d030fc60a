"""Reads `ncu --page source --csv --print-source sass` from stdin; prints the SASS instructions with the most warp
stall samples (all samples), each with its share of the kernel's samples and its three largest stall columns, and
the kernel's totals per stall column and per opcode (samples, instruction count). A reading aid for run scripts
(bench/runs/lib.sh `ncu_src`)."""
from __future__ import annotations

import csv
import signal
import sys


def _num(v: str) -> float | None:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def main(top: int = 30) -> None:
    rows = [r for r in csv.reader(sys.stdin) if r]
    head = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
    if head is None:
        print("ncu_source_top: no source table in the input (was SourceCounters collected?)")
        return
    cols, body = rows[head], rows[head + 1:]
    total_col = next((i for i, c in enumerate(cols) if "Stall Sampling (All" in c), None)
    if total_col is None:
        print("ncu_source_top: no 'Warp Stall Sampling (All Samples)' column; columns:", cols)
        return
    src = cols.index(next(c for c in cols if c.strip() == "Source"))
    addr = next((i for i, c in enumerate(cols) if "Address" in c), None)
    stall_cols = [i for i, c in enumerate(cols) if c.lower().startswith("stall") or "stall_" in c.lower()]
    samples = [(_num(r[total_col]) or 0.0, r) for r in body if len(r) == len(cols)]
    whole = sum(s for s, _ in samples) or 1.0
    print(f"{len(samples)} SASS instructions, {whole:.0f} stall samples")
    totals = {cols[i]: sum(_num(r[i]) or 0.0 for _, r in samples) for i in stall_cols}
    print("by column:", ", ".join(f"{k} {v / whole:.1%}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:8]))
    by_op: dict[str, list[float]] = {}  # opcode (predicate and operands dropped): [samples, instructions]
    for s, r in samples:
        words = [w for w in r[src].split() if not w.startswith("@")]
        op = by_op.setdefault(words[0] if words else "?", [0.0, 0])
        op[0] += s
        op[1] += 1
    print("by opcode:", ", ".join(f"{k} {v[0] / whole:.1%} ({v[1]})"
                                  for k, v in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:12]))
    _segments(samples, src, stall_cols, cols, whole)
    for s, r in sorted(samples, key=lambda x: -x[0])[:top]:
        big = sorted(((_num(r[i]) or 0.0, cols[i]) for i in stall_cols), reverse=True)[:3]
        where = r[addr] if addr is not None else ""
        print(f"{s / whole:6.1%} {where:>8} {r[src].strip()[:70]:70} " + " ".join(f"{c}={v:.0f}" for v, c in big if v))


def _segments(samples: list, src: int, stall_cols: list, cols: list, whole: float) -> None:
    """Stall samples per code segment, a segment starting at each `USETMAXREG` (a warp-specialized partition's
    register hand-over opens its code): where the samples of producers and consumers go. Printed only when the
    kernel has such segments; each is named by what it issues (MMA, async copies)."""
    cuts = [i for i, (_, r) in enumerate(samples) if "USETMAXREG" in r[src]]
    if not cuts:
        return
    for a, b in zip([0] + cuts, cuts + [len(samples)]):
        seg = samples[a:b]
        text = " ".join(r[src] for _, r in seg)
        role = "+".join(k for k, m in (("MMA", "GMMA"), ("copies", "LDGSTS")) if m in text) or "other"
        total = sum(x for x, _ in seg)
        cols_sum = sorted(((sum(_num(r[i]) or 0.0 for _, r in seg), cols[i]) for i in stall_cols), reverse=True)[:3]
        print(f"segment {a}-{b} ({role}): {total / whole:.1%} of samples; " +
              ", ".join(f"{c} {v / whole:.1%}" for v, c in cols_sum if v))


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # (read through `head`)
    main()
