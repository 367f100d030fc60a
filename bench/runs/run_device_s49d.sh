#!/bin/bash
# Session 49: ran; the kernel lost to fp8_linear at every shape (0.55-0.86x) and was removed (git show 2417fdd).
# Prepared in session 48 for session 49 (≈ 3 min): the persistent FP8 GEMV for the decode linears
# (dsv4.kernels.fp8_gemv_stream; never run before: its tests in their own process first), then Flash's decode
# linears at 1, 2 and 8 rows against the model's FP8 linear, with the copy bandwidth of the same run.
source bench/runs/lib.sh
gate 200 tests/gpu/test_fp8_gemv_stream.py || exit 1
timeout 250 python3 bench/bench_fp8_gemv_stream.py --model flash --ms 1,2,8 2>&1 | tail -24
