#!/bin/bash
# Session 22, one H200: the GPU side of an MTP engine step (kernels and GPU ms per engine part, kernels outside the
# model's forward), 8 Flash layers, prompt 4096, 1 draft on the device, B = 1 / 8; plain decode with overlap at B = 1.
source bench/runs/lib.sh
timeout 250 python3 bench/bench_engine_step.py --layers 8 --batches 1,8 --prompt 4096 --steps 24 --top 20 \
  --overlap on --speculative 1 --drafts device --timeline > $OUT/engine_mtp_gpu.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/engine_mtp_gpu.txt
grep -E "^timeline|^[a-z(][a-z_.:A-Z* ]+ +\| |^kernels outside|^  +[0-9.]+ +[0-9.]+  " $OUT/engine_mtp_gpu.txt
timeout 150 python3 bench/bench_engine_step.py --layers 8 --batches 1 --prompt 4096 --steps 24 --top 20 \
  --overlap on --timeline > $OUT/engine_plain_gpu.txt 2>&1
grep -E "^timeline|^[a-z(][a-z_.:A-Z* ]+ +\| |^kernels outside|^  +[0-9.]+ +[0-9.]+  |rror" $OUT/engine_plain_gpu.txt
