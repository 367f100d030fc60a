#!/bin/bash
# Session 50: FUSED_KV_STORE, DECODE_Q_NORM_IN_KERNEL and COMPRESS_BESIDE on by default (run_device_s50d.sh's rows);
# the GPU files that run the paged decode step, the model and graphs with them on; then FUSED_ENTRY_STORE's second
# diagnostic (trash page content read somewhere?).
source bench/runs/lib.sh
export PYTHONPATH=$PWD
runpar 400 8 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_block_sites.py \
  tests/gpu/test_pdl.py tests/gpu/test_stack_rebuild_beside.py tests/gpu/test_indexer_scores.py \
  tests/gpu/test_decode_step_fusions.py tests/gpu/test_sampler_gpu.py
timeout 150 python3 bench/runs/diag_entry_store2.py zero plain 2>&1 | grep -vE "Warning|warn" | tail -10
