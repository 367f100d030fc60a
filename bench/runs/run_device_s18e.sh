#!/bin/bash
# Session 18, one H200: after s18d's failures (blocks of pairs picked for test models whose inter dimension is one
# 128-block; fused_moe now falls back to one pair per program): the model-level GPU tests and the new MoE tests.
source bench/runs/lib.sh
run 60 tests/gpu/test_moe_gemv_mma.py -k "one_pair_where or pairs_per_program"
run 220 tests/gpu/test_model_gpu.py
