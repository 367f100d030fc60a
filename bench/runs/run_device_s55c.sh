#!/bin/bash
# Session 55 (≈ 8 min with the start): the engine's GPU tests again (the look-ahead now keeps running with grammar
# rows: their pick waits for the next step), then bench_structured.py (a grammar row's host time per step at
# Flash's vocabulary size; the mask's apply on the GPU). Run with carry [".whl"].
source bench/runs/lib.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || echo "no llguidance wheel"
export PYTHONPATH=$PWD:/tmp/site
timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py -k structured 2>&1 \
  | tail -4
timeout 120 python3 bench/bench_structured.py --reps 10 2>&1 | tail -16
