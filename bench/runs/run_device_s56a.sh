#!/bin/bash
# Prepared in session 55 for session 56 (≈ 6 min with the start): the structured-output GPU test, then
# bench_structured.py with the apply in fewer launches (host and kernel time apart, at 129,280 tokens), then the
# 8-layer B = 1 row as the session's baseline. Run with carry [".whl"].
source bench/runs/lib.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || echo "no llguidance wheel"
export PYTHONPATH=$PWD:/tmp/site
timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py -k structured 2>&1 \
  | tail -3
timeout 150 python3 bench/bench_structured.py --reps 10 2>&1 | tail -16
rows8 100 1 | sed -E 's/MTP draft.*//'
