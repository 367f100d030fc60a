#!/bin/bash
# Session 10, second call: the prefill attention sweeps with/without KV_ONE_LOAD and the 8 Flash layers' 8K prefill
# (default MoE: the Gluon kernel lost s10a's A/B).
source "$(dirname "$0")/lib.sh"
timeout 120 python3 bench/bench_prefill_glue.py --skip select queries --shapes 512,32,8,2 512,64,8,2 512,64,8,1
timeout 120 python3 bench/bench_prefill_glue.py --skip select queries --shapes 512,32,8,2 512,64,8,2 512,64,8,1 --kv-one-load
echo "--- 8K prefill of 8 Flash layers, default (the Gluon MoE lost its A/B in s10a)"
timeout 120 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 2 --batches 1 --kv-dtype fp8 --prefill 8192 \
    2>&1 | grep -E "prefill|copy"
