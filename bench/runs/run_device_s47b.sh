#!/bin/bash
# Session 47 part 2 (≈ 6 min): the race fix's sensitivity check and GPU tests, then the model / MoE / graph tests
# around session 46's changes (part 1: run_device_s47a.sh, the rows).
source bench/runs/lib.sh
timeout 60 python3 bench/check_stack_rebuild_sensitivity.py 2>&1 | tail -1
run 150 tests/gpu/test_stack_rebuild_beside.py tests/gpu/test_router_quant.py tests/gpu/test_pair_beside.py
runpar 400 6 tests/gpu/test_model_gpu.py tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe_gemv_words.py \
  tests/gpu/test_parallel_graphs.py tests/gpu/test_block_sites.py tests/gpu/test_projections.py
