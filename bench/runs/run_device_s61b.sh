#!/bin/bash
# Session 61: the prefill buckets share one set of static buffers (graphs._StaticArena) and go up to 1024 tokens by
# default. GPU tests touched by that (every bucket bit for bit against eager, serve's startup capture, the engine's
# texts now prefilled through the pieces up to 1024 tokens), then 8 Flash layers: capture time / memory and eager
# against pieces at the default buckets (up to 1024) and with a 2048 bucket. Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 300 6 tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py
timeout 100 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,600,1024 --reps 5 2>&1 | tail -6
timeout 150 python3 bench/flags.py "dsv4.model.prefill_graphs.PREFILL_BUCKETS=(16,32,64,128,256,512,1024,2048)" \
  dsv4.model.prefill_graphs.PREFILL_MAX_TOKENS=2048 -- bench/bench_prefill_graphs.py --layers 8 \
  --prompts 1024,1536,2048 --reps 5 2>&1 | tail -5
