#!/bin/bash
# Session 67 (≈ 5 min with the start). An MTP verify step at B = 1 (2 rows) and B = 2 decode run the FP8 linears on
# the tensor-core GEMM and the mHC sites on the dot mix; one row runs the CUDA-core GEMV and the rows mix. s67 eager
# profile, 8 layers, H100: linears 573 -> 689 µs, mixes 67 -> 117 µs from B = 1 to B = 2. (1) the GEMV against the
# GEMM at 1-4 rows per Flash linear (session 17's sweep, before the GEMV's later tuning); (2) 8 layers' B = 2 replay
# with the GEMV and / or the rows mix at two rows.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 bench/sweep_gemv.py --rows 1,2,3,4 --skip-grid 2>&1 | grep -v -i warn | tail -16
L=dsv4.kernels.linear_config.GEMV_MAX_M=2
X=dsv4.kernels.mhc.ROWS_MAX_T=2
for s in "" "$L" "$X" "$L $X" ""; do echo "flags: ${s:-default}"; rows8 120 2 $s; done
