#!/bin/bash
# Session 66 (≈ 5-6 min with the start): the wide kernel's 16-token tiles past the per-pair kernels (s65c: 1.09-1.13x
# the default at M = 192-512, Flash). (1) the MoE GPU tests under the new default (WIDE16_MAX_PAIRS_PER_EXPERT = 12);
# (2) the crossovers: Flash M = 96-2048 and Pro M = 128-2048, the new default against the old rule and each tile
# forced (µs per call of 8 routings in one CUDA graph); (3) 8 Flash layers' prompt forwards of 96-512 tokens, the
# new default against the old rule (bench/flags.py).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
runpar 150 6 tests/gpu/test_moe.py tests/gpu/test_moe_wide.py
C=dsv4.kernels.moe_config
OFF="$C.GEMV_PAIRED_MAX=0,$C.GEMV_MAX_PAIRS_PER_EXPERT=0"
FORCE="$OFF,$C.WIDE16_MAX_PAIRS_PER_EXPERT=0,$C.PER_GROUP_MAX_PAIRS_PER_EXPERT=0,$C.WIDE64_MIN_PAIRS_PER_EXPERT=0"
V=("default (16 to 12):" "old:$C.WIDE16_MAX_PAIRS_PER_EXPERT=0" "wide16:$OFF,$C.WIDE16_MAX_PAIRS_PER_EXPERT=1000"
   "wide32:$FORCE,$C.WIDE_SMALL_BM=32" "wide64:$FORCE,$C.WIDE_SMALL_BM=64")
timeout 150 python3 bench/bench_moe_flags.py --ms 96,128,160,192,256,384,512,640,768,1024,1536,2048 --graphs 8 \
  "${V[@]}" 2>&1 | grep -v -i warn | tail -13
timeout 150 python3 bench/bench_moe_flags.py --experts pro --ms 128,192,256,384,512,768,1024,2048 --graphs 8 \
  "${V[@]}" 2>&1 | grep -v -i warn | tail -9
for s in "$C.WIDE16_MAX_PAIRS_PER_EXPERT=12" "$C.WIDE16_MAX_PAIRS_PER_EXPERT=0"; do
  echo "== $s"
  timeout 100 python3 bench/flags.py "$s" -- bench/bench_prefill_graphs.py --layers 8 --prompts 96,192,320,512 --reps 5 \
    2>&1 | grep -E "ceilings|\||rror" | tail -6
done
