#!/bin/bash
# Session 28, one H200 (≈ 2 min): why an 8K prompt in 2048-token forwards took 409 ms against 117 ms in one (s28i):
# the fourth chunk (after 6144 tokens) of 4 Flash layers, its wall time, its kernels, and where it waits for the GPU.
source bench/runs/lib.sh
TOP=30 timeout 200 python3 bench/profile_step.py --layers 4 --prefill 2048 --prefix 6144 --syncs 2>&1 | tail -75
