#!/bin/bash
# Session 76: (1) GPU tests: moe_wide.GLU_CODES on the one-warpgroup GLU (`moe_pair_codes`, new: z's codes by the
# 128-channel block's last program to arrive) and the Triton wide kernel (its interpreter-only rounding fix; the GPU
# path's source is unchanged); (2) the A/B, Flash MoE call L2-flushed, two passes: the one-warpgroup codes, and the
# bf16 GLU's launch order (moe_wide.ASYNC_GROUP_M, default 4; s75c: 8 was 5.908 against 5.981 ms at 8K, one sample);
# (3) 8 layers' 8K prefill without / with the codes; (4) which parts launch the prefill's torch elementwise kernels
# (s75c: 332 µs in 5 launches of elementwise_kernel<128, 4> per 4-layer 8K chunk).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 150 tests/gpu/test_moe_wide.py -k "glu_codes or test_fused_moe_wide"
W=dsv4.kernels.moe_wide
flags() {
  timeout 150 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "codes:$W.GLU_CODES=True" \
    "gm8:$W.ASYNC_GROUP_M=8" "codes+gm8:$W.GLU_CODES=True,$W.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -4
}
flags; prefill8 100; prefill8 100 $W.GLU_CODES=True; flags
timeout 120 python3 bench/profile_step.py --layers 4 --prefill 8192 --order 2>&1 | grep -v -i warn \
  | grep -E "^-- |order:|elementwise_kernel<128, 4>|elementwise_kernel<128, 2>|index_elementwise" | head -30
