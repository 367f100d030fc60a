#!/bin/bash
# Session 69: the mHC GPU tests with the int64 row offsets, the new 2^31-element test among them; then that test
# again with the 32-bit offsets put back (in this copy only): it must fail.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mhc.py 2>&1 | tail -3
sed -i 's/pid_t.to(tl.int64) \* BT/pid_t * BT/; s/t = tl.program_id(0).to(tl.int64)/t = tl.program_id(0)/' \
  dsv4/kernels/mhc_kernels.py
grep -c "int64" dsv4/kernels/mhc_kernels.py
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mhc.py -k past 2>&1 | grep -E "passed|failed|Error" | tail -3
