#!/bin/bash
# Session 69: this GPU's ceilings; Pro-shaped layers (q 128 heads × 512 per token) in one forward of 40,960 tokens
# (past 2^31 / 65,536 = 32,768) against the same prompt in 8K chunks.
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import sys; sys.path.insert(0, 'bench'); from bench_engine_step import _ceilings; _ceilings(True)" 2>&1 \
  | grep ceilings
for l in 3 2; do
  timeout 240 python3 bench/check_long_forward.py --model pro --layers $l --tokens 40960 > $OUT/long_pro_$l.txt 2>&1
  rc=$?; echo "rc $rc pro $l layers"
  grep -v -i warn $OUT/long_pro_$l.txt | grep -E "tokens in one|Error|error|File .*dsv4" | tail -4
  [ $rc = 0 ] && break
done
