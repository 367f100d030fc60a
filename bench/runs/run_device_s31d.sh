#!/bin/bash
# Session 31, one H200 (≈ 4 min), after s31a-c. (1) s31a's three Nsight reports (carried back in as tmp/*.ncu-rep)
# re-read with the stall samples summed per opcode (bench/ncu_source_top.py); the default GLU's top instructions
# (s31a's printout kept only its tail). (2) test_mhc after the "block" finish's removal. (3) the session's 8-layer
# decode and 8K prefill rows on the final defaults (PAIRED_NORMS on).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
for R in glu ws_glu attn; do
  echo "== $R"
  ncu --import tmp/$R.ncu-rep --page source --csv --print-source sass 2>/dev/null | python3 bench/ncu_source_top.py \
    | head -$([ $R = glu ] && echo 24 || echo 3)
done
run 200 tests/gpu/test_mhc.py
rows8 100 1,8
prefill8 100
