#!/bin/bash
# Prepared in session 36 for session 37, one H200 (≈ 5 min): `block.FUSE_BLOCK_SITES` (each block's MoE post inside
# the next block's attention pre: one mHC site fewer per block; written without a GPU) -- its model test, then the
# 8-layer decode rows (B = 1, 8 at ctx 4096, whole-step graphs) and the 8K prefill, off / on in the same call.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 200 tests/gpu/test_block_sites.py tests/gpu/test_model_gpu.py -k "block_sites or logits_match or greedy"
F=dsv4.model.block.FUSE_BLOCK_SITES
rows8 100 1,8
rows8 100 1,8 $F=True
prefill8 100
prefill8 100 $F=True
