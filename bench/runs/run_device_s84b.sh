#!/bin/bash
# Session 84, the short form of run_device_s84a.sh (≈ 4 min, for the last device minutes): the down's register bound
# DOWN_BOUND = (160, 200) -- its bit-identity test, the MoE call at M = 1 / 2, then 8-layer B = 1 rows default /
# bound / the shared expert inline (the control).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
D1="$G.DOWN_BOUND=(160,200)"
gate 150 "tests/gpu/test_moe_glu_decode.py::test_register_bound_gives_the_same_bits" || exit 1
timeout 120 python3 bench/bench_moe_flags.py --ms 1,2 --graphs 16 "default:" "down 160:$D1" "default:" \
  "down 160:$D1" 2>&1 | grep -v -i warn | tail -4
rows8 150 1
rows8 100 1 $D1
rows8 100 1 "dsv4.model.side_stream.OVERLAP=('projections','indexer','step_tables')"
