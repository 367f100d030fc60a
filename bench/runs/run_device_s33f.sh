#!/bin/bash
# Session 33, one H200 (≈ 6 min): the new defaults GPU-tested -- moe_gemv.SCALE_WORDS for launches of two or more
# pairs per program (bytes for one), indexer_scores without the row padding -- and the 8-layer decode rows on them.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe_gemv_words.py tests/gpu/test_indexer_scores.py
run 120 tests/gpu/test_model_gpu.py -k "logits_match or greedy"
rows8 120 1,8
