#!/bin/bash
# Session 29, one H200 (≈ 2.5 min; run as one command line): the kernel-mode prefill's fused stores
# (attention.FUSED_PREFILL_STORES: window kv and compressor entries through cache_store.store_rows) — their GPU tests,
# then one 8K forward of 4 Flash layers with them off / on (wall, kernels, GPU time).
source bench/runs/lib.sh
run 150 tests/gpu/test_cache_store.py tests/gpu/test_model_gpu.py -k "prefill_chunk or fused_prefill or store_rows or inverse"
timeout 60 python3 bench/flags.py dsv4.model.attention.FUSED_PREFILL_STORES=False -- bench/profile_step.py --layers 4 \
  --prefill 8192 2>&1 | grep -E "wall|kernels,"
timeout 60 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -E "wall|kernels,"
