#!/bin/bash
# Session 30, one H200 (≈ 5 min), after s30a-c: the moe_align "blocks" fix (cursors no longer written in place:
# s30c's two failures were one warp's store landing before another's load of the same replicated value), then the
# new defaults (FUSED_POOL, FUSED_PREFILL_READS, PREFILL_HCA_CAUSAL, UNMASKED_LOADS, LARGE="blocks",
# MIXED_TILES_KERNEL) end to end: GPU tests, 8 layers 8K prefill, the 8K per-part table, the 2K timeline.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
run 200 tests/gpu/test_moe_align.py tests/gpu/test_prefill_attention.py tests/gpu/test_cache_store.py \
  tests/gpu/test_model_gpu.py -k "align or tiles or prefill or causal or pool or load_rows or greedy or graph"
prefill8 100
prefill8 100 dsv4.kernels.moe_align.LARGE="'sort'" dsv4.kernels.moe_wide.MIXED_TILES_KERNEL=False \
  dsv4.model.attention.FUSED_PREFILL_READS=False dsv4.model.attention.PREFILL_HCA_CAUSAL=False \
  dsv4.model.compressor.FUSED_POOL=False dsv4.kernels.prefill_attention.UNMASKED_LOADS=False
timeout 70 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -vE "Warn|warn" | tail -30
timeout 70 python3 bench/profile_step.py --layers 4 --prefill 2048 --timeline 2>&1 | grep -vE "Warn|warn" | tail -14
