#!/bin/bash
# Prepared in session 20 (not run yet), one H200: the host-computed decode slots (dsv4.engine.paged_decode.HOST_SLOTS,
# opt-in): the model's paged / graph GPU tests with it on (DSV4_HOST_SLOTS=1), then the 8-layer decode rows off / on
# (single steps and graph replay). Adopt it if B = 1 and B = 8 do not get slower.
source bench/runs/lib.sh
DSV4_HOST_SLOTS=1 run 220 tests/gpu/test_model_gpu.py -k "paged or graph"
echo "HOST_SLOTS off:"; rows8 90 1,8
echo "HOST_SLOTS on:"; rows8 90 1,8 dsv4.engine.paged_decode.HOST_SLOTS=True
