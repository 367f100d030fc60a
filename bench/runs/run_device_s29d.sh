#!/bin/bash
# Session 29, one H200 (≈ 4 min): the host side of eager 2048-token prefill forwards again (s29b's profile counted a
# top-k compile: the profiled fresh prompts have other key counts than the timed chunks), then one 8K-token forward
# of 4 Flash layers: wall against GPU time, and its kernels by part and name ($OUT/order_8192.txt).
source bench/runs/lib.sh
TOP=32 timeout 150 python3 bench/profile_step.py --layers 4 --prefill 2048 --prefix 6144 --host --eager 2>&1 | tail -34
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 --order > $OUT/order_8192.txt 2>&1
grep -E "wall|kernels," $OUT/order_8192.txt; sed -n '/^part/,/^ *[0-9.]* *-/p' $OUT/order_8192.txt | head -14
