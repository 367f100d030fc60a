#!/bin/bash
# Session 57 (≈ 7 min with the start): run_device_s56a.sh (structured GPU test, bench_structured, the snapshot GPU
# test with shared pages, the 8-layer B = 1 baseline), then the thinking-mode retention GPU test (retain_prefix: a
# chunk ending one token short of the prompt's end, its cache copied, under graphs and the FP8 cache). Carry [".whl"].
bash bench/runs/run_device_s56a.sh
export PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py -k thinking_turns 2>&1 \
  | tail -4
