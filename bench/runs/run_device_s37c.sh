#!/bin/bash
# Session 37c, one H200 (≈ 5 min): `attention.PREFILL_Q_NORM_IN_KERNEL` (the Gluon prefill attention norms and
# rotates q as it loads it; no `norm_rope` launch over [T, 64, 512]) -- its kernel and model tests, then the 8-layer
# 8K prefill off / on / off / on in the same call.
source bench/runs/lib.sh
run 240 tests/gpu/test_prefill_attention_gluon.py tests/gpu/test_prefill_attention.py \
  tests/gpu/test_model_gpu.py -k "gluon or q_norm or logits_match"
F=dsv4.model.attention.PREFILL_Q_NORM_IN_KERNEL
prefill_ab 100 $F
