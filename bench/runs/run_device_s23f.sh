#!/bin/bash
# Session 23, one H200: the weight prefetch before the PDL wait only up to a size (_triton.PREFETCH_MAX_BYTES).
# The launch chain per size with the prefetch on / off, then the 8-layer model at four thresholds.
source bench/runs/lib.sh
P=dsv4.kernels._triton.PREFETCH_MAX_BYTES
for v in 4611686018427387904 0; do
  echo "chain, prefetch up to $v bytes:"
  timeout 100 python3 bench/flags.py "$P=$v" -- bench/bench_grid_barrier.py --dims 1024,2048,4096 --stages 8 \
    --per-sm 4 2>&1 | grep -E "^(1024|2048|4096) |rror"
done
for v in 4611686018427387904 0 4194304 10485760 4611686018427387904; do echo "model, prefetch up to $v bytes:"; rows8 100 1,8 "$P=$v"; done
