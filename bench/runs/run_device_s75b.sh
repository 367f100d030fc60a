#!/bin/bash
# Session 75: (1) the first 8K chunk's kernels beyond the top 25 (s74's "the rest": 3.2 ms in 147 launches per 4
# layers); (2) the WS FP8 down's ring knobs at 8K (moe_fp8_ws), the GLU unchanged: the copies' lead within 227 KB
# of shared memory (default 222 KB; a raw ring of 4 per producer or 7 x slots alone are over, offline), one producer
# with a longer raw ring, the launch order; variants with 2 weight slots in processes of their own (s40: XSLOTS 8 /
# WSLOTS 2 faulted, which would take the rest of a process with it).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 130 tests/gpu/test_mhc.py  # (the row finish no longer stores u when it norms)
run 100 tests/gpu/test_moe_wide.py -k glu_codes  # (moe_wide.GLU_CODES, new)
TOP=70 timeout 170 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v -i warn | tail -95
W=dsv4.kernels.moe_fp8_ws
M=dsv4.kernels.moe_wide  # glu2wg: the GLU on two warpgroups of 64 channels each, weights in registers (255 registers
# offline, no spill; sass_stats moe_glu_wide_2wg); +codes: its epilogue stores z's codes and scales for the FP8 down
# (moe_wide.GLU_CODES: no act_quant pass over z)
flags() { timeout $1 python3 bench/bench_moe_flags.py --ms 8192 "default:" "${@:2}" 2>&1 | grep -v -i warn | tail -2; }
flags 150 "glu2wg:$M.GLU_ONE_WARPGROUP=False,$M.ASYNC_A_SMEM=False,$M.GLU_CODES=False" \
  "glu2wg+codes:$M.GLU_ONE_WARPGROUP=False,$M.ASYNC_A_SMEM=False" "p1raw6:$W.PRODUCERS=1,$W.RAW={1:6}" \
  "gm8:$M.ASYNC_GROUP_M=8"
flags 60 "x5w2raw5:$W.XSLOTS=5,$W.WSLOTS=2,$W.RAW={2:5}"
