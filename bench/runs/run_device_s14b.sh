#!/bin/bash
# Session 14: programmatic dependent launch (PDL) for the decode kernels, with the GEMMs' weight L2 prefetch
# before their wait -- bit identity against serial launches (tests/gpu/test_pdl.py), the FP8 linear / W8A16 /
# decode MoE tests with it on, 8 Flash layers with DSV4_PDL=0 vs on; the transposed fused mHC mix at 8K.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 150 tests/gpu/test_pdl.py
run 100 tests/gpu/test_fp8_linear.py tests/gpu/test_grouped_w8a16.py tests/gpu/test_moe_gemv_mma.py -x -q
B="bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8,64 --ctx 4096 --kv-dtype fp8 --prefill 8192 --cuda-graphs"
for pdl in 0 1; do
  echo "== DSV4_PDL=$pdl"
  DSV4_PDL=$pdl timeout 110 python3 $B 2>&1 | grep -E "ceilings|prefill|B=|Error"
done
timeout 80 python3 bench/sweep_mhc_mix.py --tokens 8192 --ops hc_post_pre --rows 32,64 --cols 32,64 --warps 4 \
  2>&1 | grep -v Warning | tail -8
