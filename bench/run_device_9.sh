#!/bin/bash
# One 2xH200 device call for issue #9: kernel tests touched by TP/EP, the sharded-kernels self-check,
# then the full 43-layer Flash-shaped model over TP2+EP2 (bench/bench_parallel.py).
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out9}; mkdir -p $OUT
nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_moe.py -k "align or partials" \
    > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -8
timeout 150 python3 -m dsv4.distributed.selfcheck --world 2 --device cuda --dtype bfloat16 --kernels triton 2>&1 | tail -8
timeout ${BENCH_TIMEOUT:-400} python3 bench/bench_parallel.py --world 2 --json $OUT/flash_w2.json $BENCH_ARGS 2>&1 | tee $OUT/bench.log | grep -v Warning
