#!/bin/bash
# Session 23, one H200: s23d found the 16.8 MB launch chain 11.7 µs per stage with PDL, 8.9 without. Which part:
# the early launch or the weight prefetch before the wait? Then the same three settings in the 8-layer model.
source bench/runs/lib.sh
echo "chain, PDL on, no prefetch:"
timeout 100 python3 bench/flags.py dsv4.kernels._triton.PREFETCH_KBLOCKS=0 -- bench/bench_grid_barrier.py --dims 1024,4096 \
  --stages 8 --per-sm 4 2>&1 | grep -E "^(1024|4096) |rror"
echo "model, default (PDL + prefetch 4):"; rows8 100 1,8
echo "model, PDL + no prefetch:"; rows8 100 1,8 dsv4.kernels._triton.PREFETCH_KBLOCKS=0
echo "model, no PDL:"; DSV4_PDL=0 rows8 100 1,8
echo "model, default again:"; rows8 100 1,8
