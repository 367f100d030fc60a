#!/bin/bash
# Session 46 (≈ 8 min): the router's x quantisation is now the default (moe.ROUTER_QUANTISES_X, s46a's rows) and
# the gate / up GLU programs are removed; first norm_rope.ROPE_FIRST_PREFILL measured at prefill sizes
# (bench_glue --norm: ROPE_FIRST off / on at 1, 2,048 and 8,192 rows with the prefill rule lifted, same bits
# checked), then the GPU tests of the changed code (the model's router test, the graph / paged model tests, the
# per-pair GLU's split and word tests).
source bench/runs/lib.sh
timeout 100 python3 bench/flags.py dsv4.kernels.norm_rope.ROPE_FIRST_PREFILL=True -- bench/bench_glue.py --norm \
  --tokens 1,2048,8192 2>&1 | tail -8
runpar 360 4 tests/gpu/test_router_quant.py tests/gpu/test_model_gpu.py tests/gpu/test_moe_gemv_mma.py \
  tests/gpu/test_moe_gemv_words.py
