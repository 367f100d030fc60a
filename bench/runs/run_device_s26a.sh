#!/bin/bash
# Prepared in session 25, one H200: the wide MoE kernel (one bf16 wgmma chain over K, the FP4 widening overlapped
# with asynchronous wgmma: what the decode kernels lack) at decode sizes with 16-token tiles. Session 21 forced
# only 64-token tiles (mostly padding at a few pairs per expert: 1.5-2.1x slower than the decode default).
source bench/runs/lib.sh
timeout 300 python3 bench/bench_moe_decode_wide.py --ms 1,8,16,64 --bm 16,32,64 2>&1 | grep -E "^[0-9M]|rror"
