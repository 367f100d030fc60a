#!/bin/bash
# Prepared in session 47 for session 48 (≈ 10 min, as three device calls: argument 1, 2, 3). The persistent Gluon
# decode GLU became the default (moe_glu_decode) after its own tests and the MoE call / rows benchmarks; the
# model-level GPU tests have not run with it, and the same kernel for the down GEMV (DOWN_ENABLED, opt-in) has not
# run at all. Order: its tests (a fault would waste the rest),
# the MoE call with the down off / on, rows with the GLU off / default / down on, then the model-level tests.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
if [ "$1" = 1 ]; then
timeout 240 python3 -m pytest -q -s -rf --tb=short -p no:cacheprovider tests/gpu/test_moe_glu_decode.py > $OUT/glu.txt 2>&1
grep -E "bit-identical|passed|failed|Error|error" $OUT/glu.txt | head -24
DOWN=("down:$G.DOWN_ENABLED=True")  # (left out where its tests failed: a fault would end the bench's process)
{ grep -q "FAILED.*test_down" $OUT/glu.txt || ! grep -qE "[0-9]+ passed" $OUT/glu.txt; } && DOWN=()
timeout 240 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "${DOWN[@]}" \
  "triton GLU:$G.ENABLED=False" "GLU split 2:$G.SPLIT=2" "GLU split 8:$G.SPLIT=8" "GLU ring 8:$G.STAGES=8" \
  "default again:" 2>&1 | tail -6
[ ${#DOWN[@]} -gt 0 ] && timeout 200 python3 bench/bench_moe_stages.py --tokens 1,2,4 2>&1 | tail -13
fi
[ "$1" = 2 ] && { DOWN=(); [ "$DOWN_OK" = 1 ] && DOWN=(on); }  # DOWN_OK=1: part 1 passed the down's tests
[ "$1" = 1 ] && exit 0
[ ${#DOWN[@]} -gt 0 ] && rows8 100 1,2 "$G.DOWN_ENABLED=True" && rows8 100 1,2
[ "$1" = 2 ] && exit 0
runpar 400 6 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_moe_gemv_mma.py \
  tests/gpu/test_moe.py tests/gpu/test_router_quant.py tests/gpu/test_block_sites.py
