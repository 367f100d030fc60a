#!/bin/bash
# Session 22, one H200: where the GPU idles inside an engine step (bench/engine_timeline.py), 8 Flash layers,
# prompt 4096: MTP (1 draft, drafts on the device / host) at B = 1 / 8, then plain decode (overlap off / on) at B = 1.
source bench/runs/lib.sh
timeout 280 python3 bench/bench_engine_step.py --layers 8 --batches 1,8 --prompt 4096 --steps 24 --top 20 \
  --overlap on --speculative 1 --drafts both --timeline > $OUT/engine_mtp_timeline.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/engine_mtp_timeline.txt
grep -E "^timeline|^[a-z(][a-z_.:A-Z* ]+ +\| " $OUT/engine_mtp_timeline.txt
timeout 200 python3 bench/bench_engine_step.py --layers 8 --batches 1 --prompt 4096 --steps 24 --top 20 \
  --overlap both --timeline > $OUT/engine_plain_timeline.txt 2>&1
grep -E "^[0-9]+ \||^B |rror" $OUT/engine_plain_timeline.txt
grep -E "^timeline|^[a-z(][a-z_.:A-Z* ]+ +\| " $OUT/engine_plain_timeline.txt
