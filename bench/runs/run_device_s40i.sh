#!/bin/bash
# Session 40, one H200: the default path after this session's moe_glu_fp8 refactor (_copy_weights / _reencode /
# _epilogue / _promote_tiles split out; the FP8 down GEMM is the default from 96 pairs per expert): the FP8 MoE tests
# against the reference and the model's GPU-vs-CPU logits.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k "fp8"
run 200 tests/gpu/test_model_gpu.py -k logits_match
