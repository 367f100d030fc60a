#!/bin/bash
# Session 59 (≈ 5 min with the start): the GPU defaults (graphs + FP8 cache) against eager steps over a bf16 cache,
# the whole engine GPU file with them; then the engine's decode step at 8 Flash layers, B = 1 and 8 (overlap on,
# graph replay beside it), and with one MTP draft at B = 1 (the step's cost; random weights accept few drafts).
# Carry [".whl"].
source bench/runs/lib.sh
with_llguidance
timeout 240 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py 2>&1 | tail -6
export PYTHONPATH=$PWD:/tmp/site  # (with_llguidance's path: dropped here until session 60)
timeout 150 python3 bench/bench_engine_step.py --layers 8 --batches 1,8 --overlap on --steps 32 --top 0 2>&1 \
  | grep -E "^NVIDIA|ceilings|^B \||^[0-9]+ \|"
timeout 150 python3 bench/bench_engine_step.py --layers 8 --batches 1 --overlap on --steps 32 --top 0 \
  --speculative 1 2>&1 | grep -E "^[0-9]+ \|"
