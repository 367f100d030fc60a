#!/bin/bash
# Prepared in session 42 for session 43 (≈ 6 min): two decode mHC flags, both bit-identical in the interpreter --
# mhc.ROWS_FN_EARLY (the one-token rows mix loads its fn tiles before the PDL wait: offline 110 -> 254 registers,
# 64 programs per launch, so occupancy is not at stake) and mhc.NORM_ONE_STEP (the split finish's last arriver
# normalises the row in one step, its u / weight loads before the partials' sum: offline 45 -> 48 registers).
# Their GPU tests; the mHC sites at T = 1 / 8 in CUDA graphs (bench_glue) default / each flag / both; the 8-layer
# B = 1 decode rows default / both (replay 1.24 ms at the end of session 42). Make a flag the default where it wins.
source bench/runs/lib.sh
run 200 tests/gpu/test_mhc.py -k "fn_early or rows or norm_one or split"
M=dsv4.kernels.mhc
for flags in "$M.ROWS_FN_EARLY=False" "$M.ROWS_FN_EARLY=True" "$M.NORM_ONE_STEP=True" \
             "$M.ROWS_FN_EARLY=True $M.NORM_ONE_STEP=True" "$M.ROWS_FN_EARLY=False"; do
  echo "== $flags"; timeout 120 python3 bench/flags.py $flags -- bench/bench_glue.py --tokens 1,8 2>&1 \
    | grep -vE "Warning|warn" | tail -6
done
rows8 150 1
rows8 150 1 $M.ROWS_FN_EARLY=True $M.NORM_ONE_STEP=True
