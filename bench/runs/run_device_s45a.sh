#!/bin/bash
# Prepared in session 44 for session 45 (≈ 7 min): what s44c's limits cut -- its first group stopped in test_pdl.py
# (126 passed: all of test_fp8_gemv.py and test_fused_fp8_linears_gpu.py; test_pdl.py compiles every kernel again
# in a PDL-off subprocess, so it needs time), its second in test_router.py (≈ 72 of 103; the router file passed whole
# in s43b). Then norm_rope.ROPE_FIRST_PREFILL (prepared in session 44: the early cos / sin at 8 rows per program
# too, expected bit-identical now that every rotation rounds its products): its bit-identity tests with it on.
source bench/runs/lib.sh
G=tests/gpu
run 240 $G/test_pdl.py $G/test_grid_barrier.py $G/test_parallel_graphs.py $G/test_fast_allreduce.py \
  $G/test_bf16_gemm.py $G/test_topk.py $G/test_swiglu.py $G/test_sampler_gpu.py $G/test_indexer_scores.py \
  $G/test_moe_align.py $G/test_requant.py
run 100 $G/test_router.py
PYT=$(python3 -c "import os, pytest; print(os.path.join(os.path.dirname(pytest.__file__), '__main__.py'))")
timeout 80 python3 bench/flags.py dsv4.kernels.norm_rope.ROPE_FIRST_PREFILL=True -- $PYT -q -p no:cacheprovider \
  $G/test_norm_rope.py -k "rope_first or rotation_alone" 2>&1 | grep -E "passed|failed|^E " | head -6
