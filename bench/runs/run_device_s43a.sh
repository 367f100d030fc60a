#!/bin/bash
# Prepared in session 42 for session 43 (≈ 5 min): mhc.ROWS_FN_EARLY (the one-token rows mix loads its fn tiles
# before the PDL wait: offline 110 -> 254 registers, 64 programs per launch, so occupancy is not at stake) -- its GPU
# test, then the 8-layer B = 1 decode rows off / on / off / on (replay 1.24 ms at the end of session 42).
source bench/runs/lib.sh
run 200 tests/gpu/test_mhc.py -k "fn_early or rows"
for on in False True False True; do rows8 150 1 dsv4.kernels.mhc.ROWS_FN_EARLY=$on; done
