#!/bin/bash
# (attention.Q_NORM_IN_WQ_B, fp8_linear(norm=) and tests/gpu/test_linear_norm.py were removed after session 84's run
#  of run_device_s83c.sh: no gain at B = 1 or 8, docs/benchmarks.md "Session 84")
# Session 83, one call (≈ 8 min): the q latent's RMSNorm applied by wq_b's GEMM (attention.Q_NORM_IN_WQ_B, opt-in,
# prepared offline: `fp8_linear(norm=)`, the window kv's norm + store beside on the "kv_norm" side stream), on the
# layers without an indexer (Flash: 23 of 43). One launch fewer on each such layer's chain at decode.
# 1. its tests (the fused GEMM at Flash / Pro shapes vs norm_rope + fp8_linear; the model's decode with the flag) --
#    stop if they fail;
# 2. 8 Flash layers' B = 1 / 8 rows, off / on alternating (adopt if it wins at B = 1 in both rounds and loses at
#    neither batch).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
Q=dsv4.model.attention.Q_NORM_IN_WQ_B=True
gate 300 tests/gpu/test_linear_norm.py "tests/gpu/test_decode_step_fusions.py::test_q_latent_norm_in_wq_b" || exit 1
rows8 150 1,8
rows8 100 1,8 $Q
rows8 100 1,8
rows8 100 1,8 $Q
