#!/bin/bash
# Prepared in session 47 for session 48 (≈ 8 min). The persistent Gluon decode GLU became the default (moe_glu_decode)
# after its own tests and the MoE call / rows benchmarks; the model-level GPU tests have not run with it. First the
# rows of today's defaults (a quiet GPU, timings before tests) with the GLU off / on, then the tests.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
rows8 120 1,2
rows8 100 1,2 "$G.ENABLED=False"
rows8 100 1,2
run 150 tests/gpu/test_moe_glu_decode.py
runpar 400 6 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_moe_gemv_mma.py \
  tests/gpu/test_moe.py tests/gpu/test_router_quant.py tests/gpu/test_block_sites.py
