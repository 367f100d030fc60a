#!/bin/bash
# Session 64 (≈ 7 min warm): serving while prompts arrive (bench_arrivals.py --one-pass), 8 Flash layers, B requests
# decoding at 4096 tokens of context, a 128-token prompt every 4 steps: mixed_steps' split against its one pass,
# alternating twice. The "steps split" column reads 8 / 8 in both modes (the one pass goes through the split's entry).
source bench/runs/lib.sh
for B in 8 32; do
  timeout 250 python3 bench/bench_arrivals.py --layers 8 --batch $B --prompt 4096 --arrival 128 --every 4 --steps 32 \
    --rounds 2 --one-pass 2>&1 | grep -E "ceilings|layers:|\||rror"
done
