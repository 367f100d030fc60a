#!/bin/bash
# Prepared in session 48 for session 49 (≈ 8 min, two calls: argument 1, then 2). The persistent down GEMV
# (moe_glu_decode.DOWN_ENABLED, DOWN_SPLIT 1) won in the MoE call once the combine over its partials took 256-column
# programs (37.2 / 61.6 / 110.0 vs 40.7 / 65.4 / 113.1 µs at M = 1 / 2 / 4), but its model-level run was cut by the
# device budget. Part 1: that run with it on (switched on in this device copy of the tree: pytest takes no module
# flags). Part 2: 8 Flash layers' rows with it off / on, alternating. If part 1 passes and part 2 does not lose,
# flip DOWN_ENABLED in the checkout.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
if [ "$1" = 1 ]; then
  sed -i 's/^DOWN_ENABLED = False$/DOWN_ENABLED = True/' dsv4/kernels/moe_glu_decode.py
  grep -q "^DOWN_ENABLED = True$" dsv4/kernels/moe_glu_decode.py || { echo "switch not found"; exit 1; }
  gate 100 tests/gpu/test_moe_glu_decode.py tests/gpu/test_moe_combine.py || exit 1
  runpar 420 6 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_moe_gemv_mma.py \
    tests/gpu/test_moe.py tests/gpu/test_router_quant.py tests/gpu/test_block_sites.py
else
  for f in False True False True; do
    echo "== DOWN_ENABLED=$f"; rows8 100 1,2 "$G.DOWN_ENABLED=$f" | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
  done
fi
