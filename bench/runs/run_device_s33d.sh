#!/bin/bash
# Session 33, one H200 (≈ 3 min): confirm s33b's two 8K leaders (ASYNC_STAGES 3, ASYNC_GROUP_M 8, each ≈ -6 % on
# a 2-3 % noise band) and their combination, interleaved twice; and repeat s33c's decode-size SCALE_WORDS A/B.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
W=dsv4.kernels.moe_wide
timeout 250 python3 bench/bench_moe_flags.py --ms 2048,8192 "default:" "stages3:$W.ASYNC_STAGES=3" \
  "group8:$W.ASYNC_GROUP_M=8" "s3g8:$W.ASYNC_STAGES=3,$W.ASYNC_GROUP_M=8" "default2:" "stages3b:$W.ASYNC_STAGES=3" \
  "group8b:$W.ASYNC_GROUP_M=8" "s3g8b:$W.ASYNC_STAGES=3,$W.ASYNC_GROUP_M=8" 2>&1 | tail -3
G=dsv4.kernels.moe_gemv.SCALE_WORDS
timeout 120 python3 bench/bench_moe_flags.py --ms 1,4,8,16,64 "bytes:" "words:$G=True" "bytes2:" "words2:$G=True" \
  "bytes3:" "words3:$G=True" 2>&1 | tail -6
