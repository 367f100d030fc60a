#!/bin/bash
# Session 25, the last device minutes: Pro's B = 64 row alone (s25e's 90 s limit cut it with no output), with a
# Python traceback of every thread if it is still running at the limit (SIGABRT + faulthandler): compiling, or stuck.
source bench/runs/lib.sh
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29528 PYTHONFAULTHANDLER=1 \
  timeout -s ABRT ${LIMIT:-150} python3 bench/bench_parallel.py --config bench/configs/deepseek-v4-pro.config.json \
  --world 1 --layers 4 --reps 4 --batches 64 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs > $OUT/pro64.txt 2>&1
echo "rc=$?"; grep -E "ceilings|B=.*decode " $OUT/pro64.txt; grep -A3 -E "^(Fatal|Current thread|Thread 0x)" $OUT/pro64.txt \
  | head -40; grep -E '^  File "/.*dsv4|^  File ".*bench' $OUT/pro64.txt | head -20
