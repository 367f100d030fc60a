#!/bin/bash
# Session 69: where the radix top-k's warps stall (top-512 of [8192, 65536] bf16 scores, the default chunks): Nsight
# Compute's speed of light, occupancy, scheduler and warp-state sections, then the source counters' top SASS lines.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 ncu -k regex:_topk_kernel -c 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis python3 bench/sweep_index_scores.py --prefix 253952 \
  --shapes > $OUT/topk_sections.txt 2>&1
grep -v -i "warn\|==PROF==" $OUT/topk_sections.txt | grep -E "^ +[A-Z].* [0-9.,]+$|Section" | head -60
KERNEL=_topk_kernel ncu_src 240 topk_src bench/sweep_index_scores.py --prefix 253952 --shapes | head -45
