#!/bin/bash
# (A record: the f16 variant, moe_wide_async.WIDEN_BF16=False, was removed after s27c; the bf16 path is the only one.)
# Session 27, one H200: the Gluon MoE GEMMs' widening as bf16x2 bit moves + one bf16x2 multiply per k pair, read
# as 16-bit k-pair words (moe_wide_async.WIDEN_BF16), against the f16 path (f16 bit moves, f16 -> f32, an fp32
# multiply and a bf16 pack per element). s27a: the GLU runs at 43 % of the tensor pipe and 45 % issue with 8
# warps per SM, L2 at 43 %: latency-bound on ≈ 1000 instructions per 128-wide K block per thread, most of them
# the widening; the bf16 path has 639 (GLU) and 383 vs 586 (down) in the offline sm_90a SASS.
source bench/runs/lib.sh
run 300 tests/gpu/test_moe_wide.py -k "gluon_widen or mixed or async_kernel_matches or test_fused_moe_wide"
timeout 60 python3 -c "import sys; sys.path.insert(0,'.'); from bench.bench_gemm_moe import ceilings; \
print('ceilings', {k: round(v, 2) for k, v in ceilings().items()})"
F16=dsv4.kernels.moe_wide_async.WIDEN_BF16=False
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "bf16 widening:" "f16 widening:$F16" 2>&1 | tail -9
timeout 90 python3 bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,4 128,8,reg,4 128,8,smem,4 2>&1 | tail -4
echo "== prefill, bf16 widening"; prefill8 100
echo "== prefill, f16 widening"; prefill8 100 $F16
M="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,launch__registers_per_thread,smsp__inst_executed.sum"
ncu_moe 120 4 "$M"
