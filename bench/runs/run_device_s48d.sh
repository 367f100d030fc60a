#!/bin/bash
# Session 48 (≈ 1.5 min): the decode GLU with the activation scales from global memory and the slot freed after the
# step's MMAs made unconditional: its tests again, then Nsight's source counters on the persistent kernel at one
# token (the 30 SASS instructions with the most stall samples).
source bench/runs/lib.sh
timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_moe_glu_decode.py 2>&1 | tail -2
KERNEL=_stream_kernel ncu_src 150 glu_src bench/bench_moe_stages.py --tokens 1 --calls 2
