#!/bin/bash
# Session 58: one cache copy at 43 Flash layers, the Triton page copy beside its torch reference (same pools, same
# call), then the thinking / chat retained-turn GPU test with its near-tie rule. Carry [".whl"].
source bench/runs/lib.sh
export PYTHONPATH=$PWD
timeout 120 python3 bench/bench_copy_pages.py --layers 43 --reps 20 2>&1 | tail -4
timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py -k thinking_turns 2>&1 \
  | tail -12
