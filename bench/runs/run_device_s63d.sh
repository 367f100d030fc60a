#!/bin/bash
# Session 63 (≈ 5-6 min warm): run_device_s63c.sh's A/B once more with the ceilings printed (its first run cut them),
# then run_device_s63b.sh's (1) and (2): the MTP block's prefill catch-up as pieces, and mixed steps split in two
# forwards (B = 8 and 32 decode rows at 4096 tokens of context beside a fresh prompt).
source bench/runs/lib.sh
for share in False True; do
  echo "SHARE_ACROSS_LAYERS=$share"
  timeout 100 python3 bench/flags.py dsv4.model.rope.SHARE_ACROSS_LAYERS=$share -- bench/bench_prefill_graphs.py \
    --layers 8 --prompts 16,128 --reps 5 2>&1 | grep -E "ceilings|^[0-9]+ \||rror"
done
timeout 110 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,512,2048 --reps 5 --mtp 2>&1 \
  | grep -E "ceilings|\||rror"
for B in 8 32; do
  timeout 110 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,512 --reps 5 --decode-rows $B \
    --ctx 4096 2>&1 | grep -E "ceilings|\||rror"
done
