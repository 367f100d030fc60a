#!/bin/bash
# Prepared in session 25, one H200: the wide MoE kernel (one bf16 wgmma chain over K with the FP4 widening
# overlapped: what the decode kernels lack) at decode sizes with 16 / 32-token tiles, graph-timed beside the decode
# default (session 21 timed only 64-token tiles, eagerly: 1.5-2.1x slower, mostly padding). First the new tiles'
# correctness against the reference (test_moe_wide), then Flash and Pro experts.
source bench/runs/lib.sh
run 150 tests/gpu/test_moe_wide.py -k "16-8-True or 32-8-True"
timeout 220 python3 bench/sweep_moe_batch.py --tokens 1,8,16,64 --wide 16,32,64 2>&1 | grep -vE "^  (one|two|four)"
timeout 200 python3 bench/sweep_moe_batch.py --model pro --tokens 1,8,64 --wide 16,64 2>&1 \
  | grep -vE "^  (one|two|four)"
