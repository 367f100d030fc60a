#!/bin/bash
# Session 32 (≈ 3 min): which kernels of an 8-layer 8K prefill and of B = 1 / 8 decode store (or load) 8 / 16 bits at
# a time: every compiled variant's PTX from a fresh Triton cache (bench/ptx_cache_survey.py).
source bench/runs/lib.sh
export TRITON_CACHE_DIR=/tmp/tc_s32g
rm -rf $TRITON_CACHE_DIR
prefill8 150
rows8 120 1,8 | grep -E "B=|rror"
python3 bench/ptx_cache_survey.py $TRITON_CACHE_DIR --all > $OUT/ptx_survey.txt
head -45 $OUT/ptx_survey.txt
