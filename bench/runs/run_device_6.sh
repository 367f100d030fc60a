#!/bin/bash
# One device call for issue #6: GPU tests of the mHC and attention kernels, then the e2e decode benchmark.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out6}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/smi.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_mhc.py tests/gpu/test_attention.py \
    > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|error:" $OUT/tests.log | tail -12
timeout 230 python3 bench/bench_e2e.py --out $OUT $BENCH_ARGS 2>&1 | tee $OUT/bench.log | grep -v '^{'
