#!/bin/bash
# Prepared in session 49 for session 50 (≈ 2 min): where a B = 1 decode step's GPU time goes now (4 Flash-shaped
# layers: sliding, sliding, CSA, HCA; eager, torch profiler; parts and each layer's kernels in launch order), and
# the captured step's host / GPU timeline -- the inventory to pick the next launches to remove from (#6: ≈ 25
# kernels per layer, each a few µs beyond its bytes). Files under $OUT.
timeout 150 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --order 2>&1 | grep -v -i warn \
  > $OUT/decode_b1_order.txt
head -60 $OUT/decode_b1_order.txt
timeout 150 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline 2>&1 | grep -v -i warn \
  > $OUT/decode_b1_timeline.txt
tail -30 $OUT/decode_b1_timeline.txt
