#!/bin/bash
# Session 70: a decode step at long contexts (4 Flash layers, B = 1 and 8, eager kernels): how much of a CSA layer is
# the indexer's top-k, which runs one program per row however long the row.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for args in "--batch 1 --ctx 65536" "--batch 1 --ctx 262144" "--batch 8 --ctx 65536"; do
  echo "== $args"
  timeout 240 python3 bench/profile_step.py --layers 4 $args > $OUT/prof_dec.txt 2>&1
  grep -E "kernels, |layer [0-9]" $OUT/prof_dec.txt
  sed -n '/kernels by GPU time/,$p' $OUT/prof_dec.txt | head -14
done
