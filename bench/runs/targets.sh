#!/bin/bash
# Every GPU target's current figure in one call (≈ 6-8 min warm; written in session 63 from commands that ran before,
# not yet run as one script), for the targets table at the top of docs/benchmarks.md. Report the GPU it ran on.
# #6 decode: 8 Flash layers, B = 1 / 8, ctx 4096, paged FP8, graphs (replay ms; x 43 / 8 for the whole model) and
#    the copy ceiling of the same call;
# #6 prefill: one 8K prompt of 8 Flash layers (tok/s x 8 / 43 for the whole model by the linear rule);
# #5 MoE decode: the Flash MoE call at M = 1 / 2 / 4 in CUDA graphs of 16 routings (µs; M = 1 touches 75.5 MB:
#    % of copy = 75.5 MB / time / copy bandwidth);
# #5 MoE prefill: the Flash MoE call at M = 4096 / 8192 against the FP8 blockwise peak of bench_gemm_moe's ceilings;
# #5 FP8 linears: Flash's decode- and prefill-sized linears against cuBLAS.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
[ -n "$NO_ROWS" ] || rows8 240 1,8  # (NO_ROWS=1: a call that measured the rows already)
prefill8 200
timeout 120 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" 2>&1 | grep -v -i warn | tail -6
timeout 200 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 4096,8192 --no-sweep 2>&1 \
  | grep -v -i warn | tail -12
timeout 150 python3 bench/bench_gemm_moe.py --only linear --models flash --ms 1,64,1024,4096 --no-sweep 2>&1 \
  | grep -v -i warn | tail -24
