#!/bin/bash
# (bench_mhc_chunks.py and moe_wide.GLU_CODES were removed after this run: docs/benchmarks.md "Session 77")
# Session 77, the last ≈ 150 s of device time: the ceilings, the one-warpgroup GLU codes' GPU test and its Flash MoE
# call at 8K, the prefill mHC sites chunk by chunk at the site (8K tokens).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep ceilings)
run 50 tests/gpu/test_moe_wide.py -k "glu_codes"
timeout 40 python3 bench/bench_moe_flags.py --ms 8192 "default:" "codes:dsv4.kernels.moe_wide.GLU_CODES=True" 2>&1 \
  | grep -v -i warn | tail -2
timeout 40 python3 bench/bench_mhc_chunks.py --tokens 8192 --chunks 0,1024,2048 2>&1 | grep -v -i warn | tail -3
