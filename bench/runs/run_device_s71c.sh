#!/bin/bash
# Session 71: the indexer's prefill scores on FP8 tensor cores (operands folded to e4m3, `indexer_fp8`): the GPU tests,
# then the sweep on FP4-simulated operands after 0, 56K, 120K and 248K tokens of prefix (fp8 / gluon fp8 against the
# bf16 kernels; scores must be equal), with the sampled top-k beside the default (its threshold).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 240 tests/gpu/test_indexer_scores.py
for prefix in 0 57344 122880 253952; do
  timeout 120 python3 bench/sweep_index_scores.py --fp4 --prefix $prefix --shapes --sampled 2>&1 | tail -12
done
