#!/bin/bash
# Session 69: the mHC kernels' row offsets in int64 (s69b: 139,264 tokens in one forward faulted in hc_pre), checked
# past 2^31 / (4 D) = 131,072 tokens; the 8K chunk after 248K tokens; the decode replay after the change.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for c in "flash 139264" "flash 196608"; do
  set -- $c
  timeout 200 python3 bench/check_long_forward.py --model $1 --tokens $2 > $OUT/long_$1_$2.txt 2>&1
  echo "rc $? $1 $2"; grep -v -i warn $OUT/long_$1_$2.txt | grep -E "tokens in one|Error|error|File .*dsv4" | tail -4
done
TOP=10 timeout 200 python3 bench/profile_step.py --layers 4 --prefill 8192 --prefix 253952 > $OUT/chunk_248k.txt 2>&1
grep -E "chunk after|kernels,|^layer|^forward|^ +[0-9]+ +[0-9]+ |rror|memory" $OUT/chunk_248k.txt | grep -v -i warn | head -24
rows8 150 1,8 | grep "B="
