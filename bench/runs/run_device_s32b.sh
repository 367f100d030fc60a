#!/bin/bash
# Prepared in session 31 for session 32, one H200 (≈ 5 min), after s32a: the 43-layer decode extrapolation on the
# current defaults (last re-run in session 23: 24-layer replay 3.81 ms, 8-layer 1.27; since then the 8-layer replay
# is 1.25 with PAIRED_NORMS), i.e. session 23's method: 8 and 24 layers in one call, slope per layer, 43 layers =
# 24-layer replay + 19 x slope.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
rows8 100 1
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29523 timeout 250 \
  python3 bench/bench_parallel.py --world 1 --layers 24 --reps 4 --batches 1 --ctx 4096 --kv-dtype fp8 \
  --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|model:|B=|rror" | head -8
