#!/bin/bash
# Prepared in session 60 for the next session with a device (≈ 6-8 min with the start): the GPU files that session 60
# changed but did not rerun -- test_prefill_pieces_gpu.py (its serve-startup capture test is new), test_model_gpu.py and
# test_block_sites.py (their eager-vs-graphs comparisons keep prefills eager now), test_pdl.py (prefills through the
# pieces on both sides) -- then the prefill pieces with 512 / 1024-token buckets against eager (8 Flash layers), to
# decide whether PREFILL_MAX_TOKENS should rise. Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 330 6 tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_block_sites.py \
  tests/gpu/test_pdl.py
timeout 200 python3 bench/flags.py "dsv4.model.prefill_graphs.PREFILL_BUCKETS=(16,32,64,128,256,512,1024)" \
  dsv4.model.prefill_graphs.PREFILL_MAX_TOKENS=1024 -- bench/bench_prefill_graphs.py --layers 8 \
  --prompts 128,256,384,512,1024 --reps 5 2>&1 | tail -8
