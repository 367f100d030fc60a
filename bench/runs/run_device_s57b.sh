#!/bin/bash
# Session 57, the short form of s57a for a small device budget (≈ 5 min with the start): the engine's GPU tests of
# sessions 55-57 (structured outputs, prefix snapshots with shared pages, thinking-mode retention), then
# bench_structured.py (the masks' host and kernel times apart at 129,280 tokens). Carry [".whl"].
source bench/runs/lib.sh
with_llguidance
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py \
  -k "structured or snapshots or thinking_turns" 2>&1 | tail -6
timeout 120 python3 bench/bench_structured.py --reps 10 2>&1 | tail -16
