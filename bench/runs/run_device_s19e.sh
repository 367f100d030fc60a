#!/bin/bash
# Session 19, one H200: the mHC mix for decode sizes on CUDA cores (`_mix_rows_kernel`) vs the 16-row dot tile
# (bench/runs/old_mhc.py = the previous mhc.py as bench_glue's baseline), decode attention's split sweep with the
# wide combine, then the 8-layer decode rows with the rows mix off / on (dsv4.kernels.mhc.ROWS_MAX_T).
source bench/runs/lib.sh
timeout 150 python3 bench/bench_glue.py --attn --tokens 1,4,8 --baseline bench/runs/old_mhc.py 2>&1 | grep -vE "Warning|warn"
echo "rows mix off:"; rows8 150 1,8 dsv4.kernels.mhc.ROWS_MAX_T=0
echo "rows mix on:"; rows8 150 1,8
