#!/bin/bash
# Historical: run once (s20c); the model's prefetch sites were removed after it (no gain), so its last row now fails.
# Session 20, one H200: the L2 prefetch on a side stream (dsv4.kernels.l2_prefetch, dsv4.model.prefetch).
# 1. what it buys one large decode linear after a chain of small launches (bench_l2_prefetch.py);
# 2. its GPU tests (any size, writes nothing; every site on = the same logits, eager and graphed);
# 3. the 8-layer decode rows with every site off / on.
source bench/runs/lib.sh
timeout 150 python3 bench/bench_l2_prefetch.py --chain 4,8 --chunks 4096,16384,65536 2>&1 | grep -vE "Warning|warn"
run 150 tests/gpu/test_prefetch.py
echo "prefetch off:"; rows8 90 1,8
echo "prefetch on (all sites):"; rows8 90 1,8 "dsv4.model.prefetch.SITES=('attn_in','attn_out','ffn')"
