#!/bin/bash
# Prepared in session 68 (≈ 9 min). (1) The decode replay with the decode scores kernel's packed rounding on and off
# (s68h got only the "off" rows: the first run stopped while compiling), a warm-up run first, then alternating.
# (2) The radix top-k after 56K and 248K tokens at fewer warps per row (more rows per SM: the kernel measured
# insensitive to a 22 % cut of the select pass's instructions, s68g, so latency rather than issue may bound it).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
P=dsv4.kernels.indexer_scores.PACKED_RELU
rows8 200 1 > /dev/null  # (compiles)
for s in "" "$P=False" "" "$P=False"; do echo "flags: ${s:-default}"; rows8 120 1,8 $s | grep "B="; done
for p in 57344 253952; do
  timeout 150 python3 bench/sweep_index_scores.py --prefix $p --shapes --topk 2>&1 | grep -v -i warn | grep -A12 "^top-"
done
# (3) An 8K chunk after 248K tokens through 4 Flash layers (eager; the Gluon scores from 64K keys), first measured.
TOP=10 timeout 240 python3 bench/profile_step.py --layers 4 --prefill 8192 --prefix 253952 > $OUT/chunk_248k.txt 2>&1
grep -E "chunk after|kernels,|^layer|^forward|^ +[0-9]+ +[0-9]+ |rror|memory" $OUT/chunk_248k.txt | grep -v -i warn | head -20
