#!/bin/bash
# Prepared in sessions 61-62 (≈ 6-7 min warm): the timings of their CPU-only work, 8 Flash layers.
# (Session 62's own A/B: bench/runs/run_device_s63c.sh.)
# (1) The MTP block's prefill catch-up as pieces: eager against pieces, each forward followed by the MTP block.
# (2) Mixed steps: a fresh prompt beside one decode row of each of B sequences at 4096 tokens of context, one forward
#     (the pieces on) against mixed_steps' split (decode rows as their own graphed step): B = 8 and 32. If the split
#     wins, turn SPLIT_MIXED_STEPS on (dsv4/model/mixed_steps.py) and record it.
# (3) cProfile over fresh 128-token prompts through the pieces: the host time left between them (the eager
#     attention, ≈ 2.6 ms per layer in session 60's eager profile).
source bench/runs/lib.sh
timeout 110 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,512,2048 --reps 5 --mtp 2>&1 | tail -6
for B in 8 32; do
  timeout 110 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,512 --reps 5 --decode-rows $B \
    --ctx 4096 2>&1 | tail -4
done
TOP=35 timeout 150 python3 bench/profile_step.py --layers 8 --prefill 128 --cprofile --pieces > $OUT/cprofile_pieces.txt 2>&1
grep -E "token chunk|cProfile over|function calls" $OUT/cprofile_pieces.txt
