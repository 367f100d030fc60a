#!/bin/bash
# Session 60: short prefills as piecewise CUDA graphs (dsv4.model.prefill_graphs). The new GPU tests (eager vs the
# captured pieces: bit for bit at exact buckets, bf16 level padded; the engine's greedy text with and without), the
# eager / pieces A/B at 8 Flash layers, then the engine's GPU file (its defaults now take the pieces). Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
timeout 240 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -s tests/gpu/test_prefill_pieces_gpu.py 2>&1 | \
  grep -E "padded to|passed|failed|Error|assert" | head -30
timeout 200 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,64,128,200,256 --reps 5 2>&1 | tail -9
timeout 240 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py 2>&1 | tail -6
