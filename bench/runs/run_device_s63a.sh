#!/bin/bash
# Prepared in session 61 (no device came in session 62, which added to it) for the next session with a device (≈ 7-9
# min with the start): the GPU tests of sessions 61-62's CPU-only work, then bench/runs/run_device_s63b.sh for their
# timings. Carry [".whl"].
# - session 62: the eager attention's derivations shared by the layers (paged slot lists and device block tables,
#   entry positions, the indexer's visible counts) and fewer copies for fresh prompts -- every model / engine test
#   below runs them; test_indexer_scores.py (the kernel-mode selection, its visible counts shared) and
#   test_cache_store.py (pool_chunk over the strided halves of one projection); test_topk.py (visible counts, int32
#   lists); test_shared_derivations_gpu.py (new: rope.SHARE_ACROSS_LAYERS off / on bit for bit, logits and pools);
# - test_model_gpu.py (ran at buckets up to 1024), test_block_sites.py and test_pdl.py (at 256): their prefills may
#   now take the 512-2048-token buckets;
# - test_prefill_pieces_gpu.py: the MTP block's pieces bit for bit against its eager forward at every bucket, and
#   the refactor into dsv4/model/piecewise.py;
# - test_engine_gpu.py: speculative engines now run the MTP pieces;
# - test_mixed_steps_gpu.py (new): mixed steps split in two forwards (mixed_steps.SPLIT_MIXED_STEPS, off by
#   default), the same greedy text up to a near tie;
# - test_fast_allreduce.py (its capture helper moved; two GPUs: skipped on one).
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 480 6 -rP tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_block_sites.py \
  tests/gpu/test_pdl.py tests/gpu/test_engine_gpu.py tests/gpu/test_mixed_steps_gpu.py tests/gpu/test_fast_allreduce.py \
  tests/gpu/test_indexer_scores.py tests/gpu/test_cache_store.py tests/gpu/test_topk.py tests/gpu/test_shared_derivations_gpu.py
grep -E "^prefill limit by" $OUT/pytest_par_480.txt
