#!/bin/bash
# Session 85, the short form of run_device_s85a.sh (≈ 3 min, for the last device minutes): FINISH_IN_DOWN's
# bit-identity test alone, the MoE call at M = 1 / 2 default / fold (two rounds), 8-layer B = 1 rows default / fold.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F="dsv4.kernels.moe_glu_decode.FINISH_IN_DOWN=True"
gate 150 "tests/gpu/test_moe_glu_decode.py::test_finish_in_down_gives_the_same_bits" || exit 1
timeout 90 python3 bench/bench_moe_flags.py --ms 1,2 --graphs 16 "default:" "fold:$F" "default:" "fold:$F" 2>&1 \
  | grep -v -i warn | tail -4
rows8 150 1; rows8 100 1 $F
