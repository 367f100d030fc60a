#!/bin/bash
# Session 66 (≈ 3-4 min with the start): the final rule (16-token tiles of the wide kernel to 12 pairs per expert,
# 32-token tiles to 24) against the rule before session 66, the MoE call (µs per call of 8 routings in one graph;
# Flash and Pro) and 8 Flash layers' prompt forwards of 192-1024 tokens (pieces, CUDA graphs; bench/flags.py).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=dsv4.kernels.moe_config
OLD="$C.WIDE16_MAX_PAIRS_PER_EXPERT=0,$C.WIDE32_MAX_PAIRS_PER_EXPERT=0"
timeout 100 python3 bench/bench_moe_flags.py --ms 192,512,640,768,1024,1536 --graphs 8 "default:" "old:$OLD" \
  2>&1 | grep -v -i warn | tail -7
timeout 100 python3 bench/bench_moe_flags.py --experts pro --ms 256,768,1024,1536 --graphs 8 "default:" "old:$OLD" \
  2>&1 | grep -v -i warn | tail -5
for s in "$C.WIDE16_MAX_PAIRS_PER_EXPERT=12" "$C.WIDE16_MAX_PAIRS_PER_EXPERT=0 $C.WIDE32_MAX_PAIRS_PER_EXPERT=0"; do
  echo "== $s"
  timeout 100 python3 bench/flags.py $s -- bench/bench_prefill_graphs.py --layers 8 --prompts 192,640,1024 --reps 5 \
    2>&1 | grep -E "ceilings|\||rror" | tail -5
done
