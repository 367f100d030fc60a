#!/bin/bash
# Session 12, last call: the bf16 wo_a copy test; the FP8 linear table at Flash shapes (fp8_linear now hands
# M >= 256 to cuBLAS); 8 layers side by side: this session's switches off (Triton linears, no side stream,
# 64-row fused mHC mix) vs the final defaults.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 60 tests/gpu/test_grouped_w8a16.py -k dequant
timeout 150 python3 bench/bench_gemm_moe.py --only linear --models flash --ms 1,64,256,1024,4096 --no-sweep \
    --out $OUT > $OUT/gemm.txt 2>&1; grep -E "^ceilings|^flash " $OUT/gemm.txt | head -34
B="bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 --prefill 8192 --cuda-graphs"
for flags in "dsv4.kernels.fp8_linear.CUBLAS_MIN_ROWS=1000000000 dsv4.model.side_stream.OVERLAP=() dsv4.kernels.mhc.FUSED_BT=64" \
             "dsv4.model.side_stream.OVERLAP=('shared_expert','projections')"; do
  echo "== $flags"
  timeout 120 python3 bench/flags.py $flags -- $B 2>&1 | grep -E "ceilings|prefill|B=|Error"
done
