#!/bin/bash
# Session 12, final call: GPU tests on the final tree (norm_rope's multi-row programs, the bf16 wo_a copy, the
# model end to end incl. the side-stream bit-identity), then 8 layers side by side: per-group wo_a GEMMs and
# multi-row norm_rope off vs on (the final defaults).
# (WO_A_PER_GROUP was folded into fp8_linear.grouped_linear_bf16, always on, after this call.)
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 40 tests/gpu/test_norm_rope.py tests/gpu/test_grouped_w8a16.py -k "norm_rope or dequant"
B="bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 --prefill 8192 --cuda-graphs"
for flags in "dsv4.model.attention.WO_A_PER_GROUP=False dsv4.kernels.norm_rope.ROWS_FROM=1000000000" \
             "dsv4.model.attention.WO_A_PER_GROUP=True"; do
  echo "== $flags"
  timeout 110 python3 bench/flags.py $flags -- $B 2>&1 | grep -E "ceilings|prefill|B=|Error"
done
run 150 tests/gpu/test_model_gpu.py
