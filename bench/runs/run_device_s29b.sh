#!/bin/bash
# Prepared in session 28 for session 29, one H200 (≈ 8 min): the host side of eager 2048-token prefill forwards of
# 4 Flash layers (s28j: 45.5 ms of wall time for 17.8 ms of GPU time), CPU time by torch op and part; then the MoE
# kernels' GPU tests on the tree as it stands; the chunk's kernels in launch order by part ($OUT/order_2048.txt).
source bench/runs/lib.sh
TOP=45 timeout 150 python3 bench/profile_step.py --layers 4 --prefill 2048 --prefix 6144 --host --eager 2>&1 | tail -50
run 230 tests/gpu/test_moe_wide.py
# the same chunk's kernels in launch order with the model part that launched each (to find the glue to fuse)
timeout 120 python3 bench/profile_step.py --layers 4 --prefill 2048 --prefix 6144 --order > $OUT/order_2048.txt 2>&1
grep -c "  " $OUT/order_2048.txt; tail -3 $OUT/order_2048.txt
