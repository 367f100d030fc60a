#!/bin/bash
# Session 37d, one H200 (≈ 6 min): s37c's PREFILL_Q_NORM_IN_KERNEL won nothing (96-97 ms either way: the program
# loaded Q into registers itself, its latency exposed); now Q keeps its cp.async copy and is normed in shared
# memory, the RoPE only over the rope columns. Tests, the 4-layer 8K kernel table off / on, the 8-layer prefill A/B.
source bench/runs/lib.sh
run 200 tests/gpu/test_prefill_attention_gluon.py tests/gpu/test_model_gpu.py -k "q_norm or norms_q or supports"
F=dsv4.model.attention.PREFILL_Q_NORM_IN_KERNEL
ktable 120 $F
prefill_ab 100 $F
