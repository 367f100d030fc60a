#!/bin/bash
# Session 13: the mHC mix's prefill launch shapes (bench/sweep_mhc_mix.py); whether Nsight Compute runs here,
# and if so the decode GLU kernel's stall reasons at B = 1.
source bench/runs/lib.sh
timeout 200 python3 bench/sweep_mhc_mix.py --tokens 8192,1024 2>&1 | grep -v Warning | tail -32
which ncu nsys 2>&1 | head -3
if which ncu > /dev/null 2>&1; then
  timeout 150 ncu -k regex:_mma_glu_kernel -c 1 --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section SpeedOfLight \
      python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1 --no-sweep --out $OUT > $OUT/ncu.txt 2>&1
  grep -vE "^\s*$|^==PROF==" $OUT/ncu.txt | grep -E "Stall|stall|Warp Cycles|Issued|Eligible|Occupancy|Registers|Shared Memory|Throughput|Duration|Block Limit|Active Warps|No Eligible|One or More|ERR|rror" | head -60
fi
