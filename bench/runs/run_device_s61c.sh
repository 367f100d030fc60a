#!/bin/bash
# Session 61: the prefill buckets up to 2048 tokens by default. Every bucket bit for bit against eager on the GPU and
# serve's startup capture (2048 included), then 8 Flash layers: capture time and memory (the allocator's cache
# emptied first now) and eager against pieces. Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 240 4 tests/gpu/test_prefill_pieces_gpu.py
timeout 150 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,256,1024,2048 --reps 5 2>&1 | tail -7
