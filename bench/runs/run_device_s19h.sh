#!/bin/bash
# Session 19, one H200 (last call): the CUDA-core mHC mix at one token (fused post, HC head): its GPU tests and the
# model-level tests, then the 8-layer B = 1 decode row with it off / on (dsv4.kernels.mhc.ROWS_MAX_T).
source bench/runs/lib.sh
run 70 tests/gpu/test_mhc.py -k "rows_mix or fused_finish_matches_row or repeated"
run 200 tests/gpu/test_model_gpu.py
echo "rows mix off:"; rows8 75 1 dsv4.kernels.mhc.ROWS_MAX_T=0
echo "rows mix on:"; rows8 75 1
