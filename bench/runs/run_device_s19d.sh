#!/bin/bash
# Session 19, one H200: decode attention with the chunked `_load_kv` (16-byte loads, one scale per 64-column
# chunk, one source per candidate block): its GPU tests, the split sweep at one and three pipeline stages, and
# the 8-layer decode rows before (the previous attention.py, bench/runs/old_attention.py) and after.
source bench/runs/lib.sh
run 150 tests/gpu/test_attention.py
timeout 100 python3 bench/bench_glue.py --attn --tokens 1 2>&1 | grep -vE "Warning|warn" | head -9
timeout 100 python3 bench/flags.py dsv4.kernels.attention.DECODE_STAGES=3 -- bench/bench_glue.py --attn --tokens 1 2>&1 \
  | grep -vE "Warning|warn" | head -9
echo "new attention:"; rows8 150 1,8
cp dsv4/kernels/attention.py /tmp/new_attention.py; cp bench/runs/old_attention.py dsv4/kernels/attention.py
echo "old attention:"; rows8 150 1,8
cp /tmp/new_attention.py dsv4/kernels/attention.py
