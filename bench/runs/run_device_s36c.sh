#!/bin/bash
# Session 36 (≈ 5 min): the one-pass "row" mHC finish, now the prefill default (COLLAPSE_PREFILL), on FINISH_WARPS
# also at 8192 columns (s36a: 13 failures at D = 7168, where 8 warps changed comb's bits against split); the model's
# prefill tests on that default; each layer's GPU span in an 8K prefill (CUDA events around Block.forward) with the
# per-kind full-model sum; then Nsight on the Gluon prefill attention (s35a's first half).
source bench/runs/lib.sh
run 100 tests/gpu/test_mhc.py -k "split_collapse or row_finish or prefill_sizes"
run 120 tests/gpu/test_model_gpu.py -k "prefill"
timeout 90 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -E "^layer|^forward|kernels,"
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_bytes.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_attn_kernel ncu_cmd 100 1 "$M" bench/bench_prefill_glue.py --skip select queries --shapes gluon
