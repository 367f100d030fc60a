#!/bin/bash
# Session 25, one H200: s25a found that Pro's kernel mode stopped at its first prefill (norm_rope took only
# power-of-two widths; Pro's q latent is 1536). After the padded-tile fix: the norm_rope tests (new Pro widths),
# the end-to-end GPU test on a Pro-shaped tiny model (HCA first, non-power-of-two widths), then s25a's Pro rows.
source bench/runs/lib.sh
run 100 tests/gpu/test_norm_rope.py
run 150 tests/gpu/test_model_gpu.py -k "pro" -s
grep -E "^\[e2e" $OUT/pytest_150.txt | head -8
F=dsv4.kernels.linear_config.GEMV_MIN_INFLIGHT
for v in 4194304 0; do echo "Pro, $F=$v"; pro 120 1,8 4096 0 $F=$v; done
echo "Pro, prefill 8K"; pro 120 1,8 4096 8192 $F=4194304
