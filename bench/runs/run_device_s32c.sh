#!/bin/bash
# Session 32: is the MoE call's 8.8 ms at 8K (s31e, s32a; 6.9 in s31b) the code or the machine? The same bench from
# the trees of f59efbd (s31d's code), 8f4ebdc (PERM_K added, 0) and HEAD, interleaved in one call.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
for T in cmp/a cmp/b . cmp/a .; do
  echo "tree $T"; (cd $T && timeout 60 python3 bench/bench_moe_flags.py --ms 2048,8192 "x:" 2>&1 | tail -2)
done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
