#!/bin/bash
# Prepared in session 14 (not yet run), one H200: the lazy slot derivation (DecodeStep._get: built on first use,
# the kernel path never builds the window / attended-entry gather tables) through the GPU tests, its kernel count
# in an eager step (session 14: derive 73 kernels, 93 us), and 4 vs 8 Flash layers at B = 1 / 8 so the 43-layer
# figure can be fixed + per-layer (the step/8*43 scaling counts the per-step work 5.4 times); the decode GLU /
# down kernels' L2 prefetch of their expert rows (moe_gemv.GLU_PREFETCH_KBLOCKS, off by default), bits and µs.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 180 tests/gpu/test_model_gpu.py
run 60 tests/gpu/test_moe_gemv_mma.py  # moe_gemv_cuda split out (session 14), GLU/down PREFETCH constexpr
timeout 80 python3 bench/profile_step.py --layers 4 --ctx 4096 > $OUT/profile.txt 2>&1; head -20 $OUT/profile.txt
for layers in 4 8; do
  echo "== $layers layers"
  timeout 80 python3 bench/bench_parallel.py --world 1 --layers $layers --reps 4 --batches 1,8 --ctx 4096 \
    --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=|Error"
done
timeout 100 python3 bench/bench_moe_flags.py --ms 1,8,64 "default:" \
  "pf8:dsv4.kernels.moe_gemv.GLU_PREFETCH_KBLOCKS=8" "pf16:dsv4.kernels.moe_gemv.GLU_PREFETCH_KBLOCKS=16" \
  "pf32:dsv4.kernels.moe_gemv.GLU_PREFETCH_KBLOCKS=32" 2>&1 | tail -8
