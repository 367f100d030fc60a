#!/bin/bash
# Session 44b (≈ 9 min): s44a found the graph test's failure (graph replay vs eager decode, bit for bit) started in
# session 37 (trees: s34 passes, s38 fails): the piecewise pieces ran one mHC site per sub-layer while the eager
# forward fuses each MoE post into the next attention pre (block.FUSE_BLOCK_SITES). Fixed in dsv4.model.graphs.
# s44a also showed ROPE_FIRST moving the eager logits: the compiled rotation folded the other product into its fma;
# every rotation now rounds its products (kernels._triton.rotate_pairs). The GPU tests of everything that rotates,
# then test_model_gpu.py (the graph test first), then the glue timings of the norm_rope launches.
source bench/runs/lib.sh
run 150 tests/gpu/test_norm_rope.py tests/gpu/test_cache_store.py tests/gpu/test_projections.py \
  tests/gpu/test_block_sites.py tests/gpu/test_attention.py
run 120 tests/gpu/test_prefill_attention.py tests/gpu/test_prefill_attention_gluon.py
run 280 tests/gpu/test_model_gpu.py
timeout 40 python3 bench/bench_glue.py --norm --tokens 1,8 2>&1 | tail -8
