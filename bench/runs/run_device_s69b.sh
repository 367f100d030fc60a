#!/bin/bash
# Session 69: one long forward against the same prompt in 8K chunks (32-bit row offsets; s69a's 248K-token
# prefix in one forward faulted), then s69a's 8K chunk after 248K tokens with the prefix in chunks.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for c in "flash 65536" "pro 32768" "flash 98304" "flash 139264"; do
  set -- $c
  CUDA_LAUNCH_BLOCKING=1 timeout ${LIM:-140} python3 bench/check_long_forward.py --model $1 --tokens $2 > $OUT/long_$1_$2.txt 2>&1
  echo "rc $? $1 $2"; grep -v -i warn $OUT/long_$1_$2.txt | grep -E "tokens in one|Error|error|File .*dsv4" | tail -4
done
[ -n "$CHECKS_ONLY" ] && exit 0
TOP=10 timeout 240 python3 bench/profile_step.py --layers 4 --prefill 8192 --prefix 253952 > $OUT/chunk_248k.txt 2>&1
grep -E "chunk after|kernels,|^layer|^forward|^ +[0-9]+ +[0-9]+ |rror|memory" $OUT/chunk_248k.txt | grep -v -i warn | head -20
