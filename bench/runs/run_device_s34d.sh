#!/bin/bash
# Session 34, one H200 (≈ 8 min), after s34c: GLUON now the default. (1) The prefill attention tests (the Triton
# kernel's module pins GLUON off; the Gluon module), the attention and model tests whose prefill takes it;
# (2) the Gluon kernel's ring shapes: 64-key tiles x 2 slots (default) vs 32-key x 4 / x 3, per layer kind at 8K;
# (3) Nsight Compute on one CSA launch (8K): tensor pipe, issue, L2 -> SM bytes, stalls.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 200 tests/gpu/test_prefill_attention.py tests/gpu/test_prefill_attention_gluon.py tests/gpu/test_attention.py
run 240 tests/gpu/test_model_gpu.py -k "logits_match or greedy or prefill"
G=dsv4.kernels.prefill_attention_gluon
for V in "" "$G.BN=32 $G.STAGES=4" "$G.BN=32 $G.STAGES=3" ""; do
  echo "gluon $V"
  timeout 100 python3 bench/flags.py $V -- bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 | tail -3
done
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_bytes.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_attn_kernel ncu_cmd 200 1 "$M" bench/bench_prefill_glue.py --skip select queries --shapes gluon
