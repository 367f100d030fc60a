#!/bin/bash
# Session 12, first call: cuBLAS blockwise FP8 GEMM for prefill-sized linears (fp8_linear.CUBLAS_MIN_ROWS) and the
# side stream (shared expert beside the routed experts, compressor/indexer projections beside the query path):
# GPU tests, then 8 Flash layers with both off / cuBLAS only / both on, 8K prefill and graph decode at ctx 8192.
# (OVERLAP was a bool here; from s12b on it is a tuple of branch names: "()" = off.)
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 200 tests/gpu/test_fp8_linear.py tests/gpu/test_fused_fp8_linears_gpu.py -k "cublas or default_config or bad or stacked"
run 240 tests/gpu/test_model_gpu.py
B="bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 --prefill 8192 --cuda-graphs"
for flags in "dsv4.kernels.fp8_linear.CUBLAS_MIN_ROWS=1000000000 dsv4.model.side_stream.OVERLAP=False" \
             "dsv4.model.side_stream.OVERLAP=False" "dsv4.model.side_stream.OVERLAP=True"; do
  echo "== $flags"
  timeout 150 python3 bench/flags.py $flags -- $B 2>&1 | grep -E "ceilings|prefill|B=|Error|error"
done
