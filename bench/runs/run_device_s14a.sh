#!/bin/bash
# Session 14, first call: session 13's unverified changes (mHC tests incl. the transposed mix, the FP8 linear
# tests after the linear_config split), the mix's prefill launch shapes incl. MIX_TRANS, the decode MoE
# alternatives on more, lighter programs, and one eager B = 1 decode step's kernels by part (ctx 4096).
source bench/runs/lib.sh
run 150 tests/gpu/test_mhc.py
timeout 150 python3 bench/sweep_mhc_mix.py --tokens 8192,1024 2>&1 | grep -v Warning | tail -40
timeout 120 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1,8,64 \
    --out $OUT > $OUT/moe.txt 2>&1; grep -E "^ceilings|^flash|mma64|best" $OUT/moe.txt | head -50
timeout 90 python3 bench/profile_step.py --layers 4 --ctx 4096 --order > $OUT/profile.txt 2>&1; head -c 9000 $OUT/profile.txt
