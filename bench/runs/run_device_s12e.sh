#!/bin/bash
# Session 12: prefill glue -- one-launch dequantised activation for the wide MoE, one-launch bf16 wo_a copy,
# the fused mHC mix at 32 vs 64 token rows (bench_glue at 8K tokens), GPU tests of the touched kernels, then
# the 8K prefill + graph decode on the new defaults.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 150 tests/gpu/test_grouped_w8a16.py tests/gpu/test_mhc.py tests/gpu/test_moe_wide.py -k "dequant or requant or mhc or fused_moe_wide"
for bt in 64 32 16; do
  echo "== FUSED_BT=$bt"
  timeout 60 python3 bench/flags.py dsv4.kernels.mhc.FUSED_BT=$bt -- bench/bench_glue.py --tokens 1024,8192 2>&1 | grep -vE "^\s*$" | tail -6
done
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 \
    --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|B="
