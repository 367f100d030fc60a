#!/bin/bash
# (Needs commit f21746c: the seesaw kernel was removed after this run.)
# Session 39: the seesaw prefill attention (prefill_attention_seesaw: the two warpgroups on alternate key tiles,
# warp-specialized) -- its GPU tests (the Gluon tests run with both kernels), then the per-layer-kind times of the
# pair kernel and the seesaw one side by side at 8K (max abs diff against the pair kernel), then the 4-layer 8K
# profile's attention row with SEESAW off / on.
source bench/runs/lib.sh
run 330 tests/gpu/test_prefill_attention_gluon.py -k "seesaw"
timeout 120 python3 bench/bench_prefill_glue.py --skip select queries --shapes gluon seesaw 2>&1 | tail -5
# (second call) ktable 140 dsv4.kernels.prefill_attention_gluon.SEESAW "_attn_kernel|_seesaw_kernel"
