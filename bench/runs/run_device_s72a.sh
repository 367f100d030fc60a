#!/bin/bash
# Session 72: session 71's prepared FP8-fold check and timing (run_device_s71e.sh), then the GPU tests of the
# indexer scores and the top-k (the sampled top-k is now the default for long rows).
source bench/runs/lib.sh
bash bench/runs/run_device_s71e.sh
runpar 300 8 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
# the sampled top-k's grouped listing scan and fitted chunks (session 72, offline SASS only) after 24K, 56K, 120K and 248K
# tokens of prefix (N = 8K, 16K, 32K, 64K entries per row)
for prefix in 24576 57344 122880 253952; do
  timeout 100 python3 bench/sweep_index_scores.py --sampled --prefix $prefix --shapes 2>&1 | grep -E "keys|top-|SAMPLED|^default \|"
done
