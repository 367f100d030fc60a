#!/bin/bash
# Session 44c (≈ 9 min): the GPU test files that no run script of sessions 35-43 ran (the whole of tests/gpu last ran
# in session 6; s44a found a graph test broken since session 37), linears and small kernels first, the MoE files
# after, the slow FP8 GEMM file last. Each group under its own limit; the failures listed.
source bench/runs/lib.sh
G=tests/gpu
run 170 $G/test_fp8_gemv.py $G/test_fused_fp8_linears_gpu.py $G/test_pdl.py $G/test_grid_barrier.py \
  $G/test_parallel_graphs.py $G/test_fast_allreduce.py $G/test_bf16_gemm.py $G/test_topk.py $G/test_swiglu.py \
  $G/test_sampler_gpu.py $G/test_indexer_scores.py $G/test_moe_align.py $G/test_requant.py
run 200 $G/test_grouped_w8a16.py $G/test_moe_gemv_mma.py $G/test_moe_gemv_words.py $G/test_moe.py $G/test_router.py
run 180 $G/test_fp8_linear.py $G/test_mhc.py
