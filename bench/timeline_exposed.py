"""Where a captured decode step's time goes along its chain, from `profile_step.py --timeline --kernels` output.

    python bench/timeline_exposed.py timeline_b1.txt [--from 497.9 --to 1069.3] [--chain]

Under PDL a kernel's span starts when it is scheduled, not when its wait returns, so spans overlap and summing them
double-counts (session 52). Read by ends instead: in end order, a kernel's exposed time is the part of its span after
the latest earlier end -- the time by which it moved the step's frontier. The exposed times of a window add up to its
last end minus its first start wherever the GPU was never idle; a kernel overlapped by a longer one on another stream
has 0. Per kernel name: count, exposed µs and share, summed span (as the profiler would add it up). `--chain` also
lists every kernel in end order with its exposed µs. Spans of host labels (`_StepBucket.run`, `DecodeStep.fill`, ...:
the profiler's `record_function` ranges) are left out. Where streams overlap, a side stream's kernel takes the credit
for the time up to its end even if the main stream was busy too: `--streams` counts only the named streams' kernels.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from typing import NamedTuple

_ROW = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+s(\S+)\s+(.+?)\s*$")
_LABEL = re.compile(r"^[A-Za-z_]\w*\.\w+$")  # Class.method: a record_function range, not a kernel


class Kernel(NamedTuple):
    start: float
    span: float
    stream: str
    name: str

    @property
    def end(self) -> float:
        return self.start + self.span


def parse(lines) -> list[Kernel]:
    """The rows of the "GPU kernels (µs from the first: ...)" table, host labels left out."""
    rows, on = [], False
    for line in lines:
        if line.startswith("GPU kernels"):
            on = True
            continue
        if on:
            m = _ROW.match(line)
            if not m:
                if rows:
                    break
                continue
            k = Kernel(float(m.group(1)), float(m.group(2)), m.group(3), m.group(4))
            if not _LABEL.match(k.name):
                rows.append(k)
    return rows


def exposed(kernels: list[Kernel], frontier: float | None = None) -> list[tuple[Kernel, float]]:
    """(kernel, exposed µs) in end order (ties: start order); frontier: count only the time after it."""
    out = []
    for k in sorted(kernels, key=lambda k: (k.end, k.start)):
        lead = k.span if frontier is None else max(0.0, k.end - max(k.start, frontier))
        out.append((k, lead))
        frontier = k.end if frontier is None else max(frontier, k.end)
    return out


def _short(name: str) -> str:
    """A torch kernel's template name cut to its first two `at::native` names (`vectorized_elementwise_kernel /
    cos_kernel_cuda`: the profile's names are cut at 90 characters), others to 60 characters."""
    parts = re.findall(r"at::native::(?:\(anonymous namespace\)::)?(\w+)", name)
    return " / ".join(parts[:2]) if name.startswith("void") and parts else name[:60]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", help="profile_step.py output (default: stdin)")
    ap.add_argument("--from", dest="lo", type=float, default=None,
                    help="count from this time (µs): kernels ending after it, their time after it")
    ap.add_argument("--to", dest="hi", type=float, default=None, help="count kernels ending up to this time (µs)")
    ap.add_argument("--chain", action="store_true", help="also every kernel in end order")
    ap.add_argument("--streams", default=None, help="comma-separated stream ids (the table's s<id>) to count only")
    args = ap.parse_args(argv)
    with open(args.file) if args.file else sys.stdin as f:
        kernels = parse(f)
    keep = set(args.streams.split(",")) if args.streams else None
    kernels = [k for k in kernels if (args.lo is None or k.end > args.lo) and (args.hi is None or k.end <= args.hi)
               and (keep is None or k.stream in keep)]
    if not kernels:
        print("timeline_exposed: no kernel rows (was profile_step run with --timeline --kernels?)")
        return
    rows = exposed(kernels, args.lo)
    window = max(k.end for k in kernels) - (args.lo if args.lo is not None else min(k.start for k in kernels))
    total = sum(e for _, e in rows)
    if args.chain:
        for k, e in rows:
            print(f"  end {k.end:8.1f}  exposed {e:6.1f}  span {k.span:6.1f}  s{k.stream:<4} {_short(k.name)}")
    by = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k, e in rows:
        entry = by[_short(k.name)]
        entry[0] += 1
        entry[1] += e
        entry[2] += k.span
    print(f"{len(rows)} kernels over {window:.1f} µs; exposed {total:.1f} µs (the rest: GPU idle)")
    print(f"{'kernel':52} {'count':>5} {'exposed µs':>11} {'share':>6} {'span µs':>9}")
    for name, (n, e, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:52]:52} {n:5d} {e:11.1f} {e / total:6.1%} {s:9.1f}")


if __name__ == "__main__":
    main()
