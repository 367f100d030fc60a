#!/bin/bash
# Session 19, one H200: Nsight Compute on the latency-bound kernels of a B = 1 decode layer (decode attention
# sliding / CSA, its split combine, the mHC mix + finish at one token), then their graph-timed split sweep.
source bench/runs/lib.sh
K='regex:_decode_attn|_combine_wide|_mix_kernel|_finish_split'
timeout 200 ncu -k "$K" --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis python3 bench/ncu_kernels.py --only glue > $OUT/ncu_glue.txt 2>&1
grep -cE "^  [_a-z].*\(" $OUT/ncu_glue.txt; tail -2 $OUT/ncu_glue.txt
timeout 120 ncu -k regex:_decode_attn -c 4 --section SourceCounters --section WarpStateStats \
  python3 bench/ncu_kernels.py --only glue > $OUT/ncu_attn_src.txt 2>&1
tail -2 $OUT/ncu_attn_src.txt
timeout 150 python3 bench/bench_glue.py --attn --tokens 1 2>&1 | grep -vE "Warning|warn"
