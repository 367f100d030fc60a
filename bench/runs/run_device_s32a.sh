#!/bin/bash
# Prepared in session 31 for session 32, one H200 (≈ 6 min). Session 31 made moe_wide.PERM_K = 2 the default after
# its own tests (`test_moe_wide -k "gluon_widen or requant or permute or perm_k"`, the model's logits / greedy /
# fused-prefill tests) on a machine that ran ≈ 25 % slow. (1) the rest of the MoE GPU tests on the new default
# (decode-size tiles bm 16 / 32 through the Gluon GLU, the WS comparison, mixed tiles); (2) PERM_K 0 / 2 / 0 / 2 on
# the Flash MoE call and the 8-layer 8K prefill, to restate session 31's figures on a normal-speed machine.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
run 240 tests/gpu/test_moe_wide.py tests/gpu/test_moe.py tests/gpu/test_requant.py
P=dsv4.kernels.moe_wide.PERM_K
timeout 90 python3 bench/bench_moe_flags.py --ms 2048,8192 "perm0:$P=0" "perm2:$P=2" "perm0b:$P=0" "perm2b:$P=2" 2>&1 \
  | tail -3
prefill8 80 "$P=0"
prefill8 80 "$P=2"
