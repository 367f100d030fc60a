#!/bin/bash
# Session 82, one call (≈ 4 min): where the decode MoE's down (60 % of copy at one token, session 80's time line) and
# the one-row attention linears spend their time, by Nsight Compute (clocks locked by ncu: kernel times are longer
# than in the model's graphs; read the DRAM share and the stalls, not the µs).
# (1) per kernel at one token (bench/ncu_kernels.py --only decode, each op twice): the persistent GLU / down
#     (`_stream_kernel`), the GLU's finish, the combine, wq_b / wo_b (`_fp8_gemm_kernel`), wo_a (`_fp8_gemv_kernel`);
# (2) the down's stall samples per SASS instruction and per partition (producer / consumers);
# (3) the same for the GLU, for comparison.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL="_stream_kernel|_finish_kernel|_combine|_fp8_gemm_kernel|_fp8_gemv_kernel" ncu_cmd 200 20 "$M" \
  bench/ncu_kernels.py --only decode
[ -n "$RUN_S82A_METRICS_ONLY" ] && exit 0
for skip in 1 0; do
  timeout 120 ncu -k regex:_stream_kernel --launch-skip $skip -c 1 --section SourceCounters --section WarpStateStats \
    -f -o $OUT/stream$skip python3 bench/ncu_kernels.py --only decode > /dev/null 2>&1
  echo "== _stream_kernel launch $skip (1: the down, 0: the GLU)"
  ncu --import $OUT/stream$skip.ncu-rep --page source --csv --print-source sass 2>/dev/null \
    | python3 bench/ncu_source_top.py | head -24
done
