#!/bin/bash
# Prepared in session 54 for session 55 (≈ 6 min): the engine's GPU tests (prefix snapshots on the GPU, written in
# s54, not run; s55: structured outputs, with the llguidance wheel carried in .whl) with the model-level files, then
# the 8-layer rows at B = 1, 8, 64 with session 54's defaults (the side branches at high priority; s54 measured
# B = 1 and 8 only), then the B = 1 timeline. Run with carry [".whl"].
source bench/runs/lib.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || echo "no llguidance wheel: the structured-output test skips"
export PYTHONPATH=$PWD:/tmp/site
runpar 260 8 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_decode_step_fusions.py \
  tests/gpu/test_sampler_gpu.py
grep -E "SKIPPED|skipped" $OUT/pytest_par_260.txt | head -3
rows8 100 1,8,64 | sed -E 's/MTP draft.*//'
timeout 90 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline --kernels > $OUT/timeline.txt 2>&1
head -3 $OUT/timeline.txt | grep "decode step"
