#!/bin/bash
# Session 76: (1) the Triton wide kernel's GPU tests after its interpreter-only rounding fix (the GPU path's source
# is unchanged); (2) which labelled parts launch the prefill's torch elementwise kernels (s75c: 332 µs in 5
# launches of elementwise_kernel<128, 4> per 4-layer 8K chunk); (3) the bf16 GLU's launch order
# (moe_wide.ASYNC_GROUP_M, default 4; s75c: 8 was 5.908 against 5.981 ms at 8K, one sample), two passes.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 150 tests/gpu/test_moe_wide.py -k "test_fused_moe_wide"
timeout 120 python3 bench/profile_step.py --layers 4 --prefill 8192 --order 2>&1 | grep -v -i warn \
  | grep -E "^-- |order:|elementwise_kernel<128, 4>|elementwise_kernel<128, 2>|Memset|index_elementwise" | head -40
M=dsv4.kernels.moe_wide.ASYNC_GROUP_M
for pass in 1 2; do
  timeout 150 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "gm2:$M=2" "gm8:$M=8" "gm16:$M=16" \
    2>&1 | grep -v -i warn | tail -4
done
