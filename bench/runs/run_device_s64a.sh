#!/bin/bash
# Ran in session 63 on an H100 (s63g, docs/benchmarks.md); for an H200 row (≈ 2-3 min warm): serving while prompts arrive (bench/bench_arrivals.py), the mixed-step
# split (mixed_steps.SPLIT_MIXED_STEPS, on by default since session 63's s63d) off / on, alternating twice; 8 Flash
# layers, B requests decoding at 4096 tokens of context, a 128-token prompt arriving every 4 steps. The "steps split"
# column must read 8 / 8 with the split on and 0 / 8 off.
source bench/runs/lib.sh
for B in 8 32; do
  timeout 200 python3 bench/bench_arrivals.py --layers 8 --batch $B --prompt 4096 --arrival 128 --every 4 --steps 32 \
    --rounds 2 2>&1 | grep -E "ceilings|layers:|\||rror"
done
