#!/bin/bash
# Session 68 (≈ 3 min). Where the Gluon prefill scores start to win (s68e: 0.98x the Triton kernel at 16K keys, 1.08x
# at 64K): 32K and 128K keys (prefixes of 120K and 504K tokens), 8K queries; its GPU test with the key-count rule.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 122880 516096; do
  timeout 150 python3 bench/sweep_index_scores.py --prefix $p --shapes 2>&1 | grep -v -i warn | grep -v "^4096, 8\|^top-"
done
run 120 tests/gpu/test_indexer_scores.py
