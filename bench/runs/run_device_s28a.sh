#!/bin/bash
# Prepared in session 27, one H200 (≈ 3 min): (1) the wide MoE kernel below 16 pairs per expert (session 27 moved
# its lower bound from 40 to 16 on measured wins at 18-36; 12 and below not measured); (2) where an 8K prefill
# layer's time goes after session 27's MoE change (kernels by part), to pick the next target for #6's 20k tok/s.
source bench/runs/lib.sh
C=dsv4.kernels.moe_config
timeout 100 python3 bench/bench_moe_flags.py --ms 256,384,512,640 "default:" \
  "wide from 4:$C.WIDE64_MIN_PAIRS_PER_EXPERT=4" 2>&1 | tail -5
timeout 150 python3 bench/flags.py "dsv4.model.side_stream.OVERLAP=()" -- bench/profile_step.py --layers 4 \
  --prefill 8192 2>&1 | tail -40
