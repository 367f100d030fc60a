#!/bin/bash
# Prepared in session 61 for the next session with a device (≈ 5-7 min with the start): the GPU files whose prefills
# may now go through the pieces' 512-2048-token buckets but that ran only with smaller limits (test_model_gpu.py at
# 1024, test_block_sites.py and test_pdl.py at 256), and test_prefill_pieces_gpu.py again (a failed capture now keeps
# `last_streams` of a decode bucket). Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 420 6 -rP tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_block_sites.py \
  tests/gpu/test_pdl.py
grep -E "^prefill limit by" $OUT/pytest_par_420.txt
