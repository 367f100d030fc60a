#!/bin/bash
# Session 13: the Gluon prefill MoE's launch order (moe_wide.ASYNC_GROUP_M: 0 = row blocks fastest, the old
# order), the MoE call alone and 8 Flash layers at 8K prefill; the wide-MoE GPU tests.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 150 tests/gpu/test_moe_wide.py -k "async or fused_moe_wide"
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "order0:dsv4.kernels.moe_wide.ASYNC_GROUP_M=0" \
  "g2:dsv4.kernels.moe_wide.ASYNC_GROUP_M=2" "g4:dsv4.kernels.moe_wide.ASYNC_GROUP_M=4" \
  "g8:dsv4.kernels.moe_wide.ASYNC_GROUP_M=8" 2>&1 | tail -5
B="bench/bench_parallel.py --world 1 --layers 8 --reps 3 --batches 1 --ctx 8192 --kv-dtype fp8 --prefill 8192 --cuda-graphs"
for flags in "dsv4.kernels.moe_wide.ASYNC_GROUP_M=0" "dsv4.kernels.moe_wide.ASYNC_GROUP_M=4"; do
  echo "== $flags"
  timeout 100 python3 bench/flags.py $flags -- $B 2>&1 | grep -E "ceilings|prefill|B=|Error"
done
