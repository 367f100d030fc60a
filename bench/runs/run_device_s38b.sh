#!/bin/bash
# Prepared in session 37 for session 38, one H200 (≈ 6 min): `prefill_attention_gluon.PERSISTENT` (written without a
# GPU; a program per SM walks the queries and issues the next query's Q and tile 0 copies before this query's
# epilogue: session 34 measured ≈ 0.17 ms per 8K layer of per-query fixed cost, and the Q norm costs ≈ 2 µs per query
# since s37d). Its tests (bit-identical to a program per query), the 4-layer 8K kernel table off / on, then the
# 8-layer 8K prefill off / on / off / on. If it wins: make it the default (then drop the per-query launch if the
# decode-sized prefill chunks are not slower).
source bench/runs/lib.sh
run 300 tests/gpu/test_prefill_attention_gluon.py tests/gpu/test_model_gpu.py -k "persistent or gluon_matches"
F=dsv4.kernels.prefill_attention_gluon.PERSISTENT
ktable 120 $F
prefill_ab 100 $F
