#!/bin/bash
# Session 72: session 71's prepared FP8-fold check and timing (run_device_s71e.sh), then the GPU tests of the
# indexer scores and the top-k (the sampled top-k is now the default for long rows).
source bench/runs/lib.sh
bash bench/runs/run_device_s71e.sh
runpar 300 8 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
