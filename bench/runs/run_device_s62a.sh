#!/bin/bash
# Prepared in session 61 for the next session with a device (≈ 8-10 min with the start). (1) The GPU files whose
# prefills may now go through the pieces' 512-2048-token buckets but that ran only with smaller limits
# (test_model_gpu.py at 1024, test_block_sites.py and test_pdl.py at 256); test_prefill_pieces_gpu.py with the new
# MTP-pieces test (the MTP block's catch-up bit for bit against its eager forward at every bucket) and the refactor
# into dsv4/model/piecewise.py; test_engine_gpu.py (speculative engines now run the MTP pieces). (2) The MTP pieces'
# gain: 8 Flash layers + the MTP block, eager against pieces. Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 420 6 -rP tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_block_sites.py \
  tests/gpu/test_pdl.py tests/gpu/test_engine_gpu.py
grep -E "^prefill limit by" $OUT/pytest_par_420.txt
timeout 120 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,512,2048 --reps 5 --mtp 2>&1 | tail -6
# (3) The host time left inside the prefill pieces (the eager attention, ≈ 2.6 ms per layer in session 60's eager
# profile): cProfile over fresh 128-token prompts through the pieces, by own time and by cumulative time.
TOP=35 timeout 150 python3 bench/profile_step.py --layers 8 --prefill 128 --cprofile --pieces > $OUT/cprofile_pieces.txt 2>&1
grep -E "token chunk|cProfile over|function calls" $OUT/cprofile_pieces.txt
