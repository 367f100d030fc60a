#!/bin/bash
# Session 16, nvidia-h200-x2: the sharded graph test with per-phase timestamps and a stack dump on a hang
# (session 15b's run printed nothing within 300 s; the full-Flash --world 2 --cuda-graphs bench was fine).
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (device KINDS.md)
timeout 570 python3 -m pytest -x -s -q -p no:cacheprovider tests/gpu/test_parallel_graphs.py > $OUT/pg.txt 2>&1
echo "rc=$?"
grep -vE "^\s*$" $OUT/pg.txt | grep -vE "Warning|warn" | tail -60
