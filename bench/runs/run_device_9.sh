#!/bin/bash
# 2xH200 device calls for issue #9.  PART=check (default): kernel tests touched by TP/EP, the
# sharded-kernels self-check on the embedded model, then the full 43-layer Flash-shaped model over
# TP2+EP2.  PART=scale: the first 8 Flash layers on 1 and on 2 GPUs, then 8 Pro-shaped layers on 2.
# PART=mhc (after the mHC kernels went into the model): GPU model tests, 8 Flash layers on 1 GPU,
# the full 43 layers on 2.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out9}; mkdir -p $OUT
B="python3 bench/bench_parallel.py"
if [ "${PART:-check}" = check ]; then
  nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_moe.py tests/gpu/test_fp8_linear.py \
      -k "align or partial" > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -8
  timeout 120 python3 -m dsv4.distributed.selfcheck --world 2 --device cuda --dtype bfloat16 --kernels triton \
      --checkpoint dsv4/assets/tiny 2>&1 | grep -v Warn | tail -6
  timeout ${BENCH_TIMEOUT:-360} $B --world 2 --json $OUT/flash43_w2.json $BENCH_ARGS 2>&1 | tee $OUT/flash43.log | grep -v Warn
elif [ "$PART" = mhc ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_mhc.py \
      tests/gpu/test_fp8_linear.py -k "not every_config" > $OUT/tests.log 2>&1; echo "tests rc=$?"
  grep -E "passed|failed|Error" $OUT/tests.log | tail -8
  timeout 120 $B --world 1 --layers 8 --batches 1,8,64 --json $OUT/flash8_w1_mhc.json 2>&1 | grep -v Warn
  timeout 250 $B --world 2 --batches 1,16,64 --reps 4 --json $OUT/flash43_w2_mhc.json 2>&1 | grep -v Warn
else
  timeout 170 $B --world 1 --layers 8 --batches 1,8,64 --json $OUT/flash8_w1.json 2>&1 | grep -v Warn
  timeout 170 $B --world 2 --layers 8 --batches 1,8,64 --json $OUT/flash8_w2.json 2>&1 | grep -v Warn
  timeout 200 $B --world 2 --layers 8 --batches 1,16,64 --config bench/configs/deepseek-v4-pro.config.json \
      --json $OUT/pro8_w2.json 2>&1 | grep -v Warn
fi
