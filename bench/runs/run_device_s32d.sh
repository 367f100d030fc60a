#!/bin/bash
# Session 32 (≈ 6 min): requant's permutation done in registers (contiguous 16-byte stores again; s32c: the
# per-element destinations of 8f4ebdc compiled to 16-bit stores: MoE call 2.30 -> 3.23 ms at 2K, 6.9 -> 8.9 at 8K),
# and moe_wide.ASYNC_STORE_T (the Gluon epilogue through shared memory, 16-byte stores instead of 16-bit ones).
# Tests, the MoE call against f59efbd's tree (cmp/a) and the variants, then the 8-layer 8K prefill.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 240 tests/gpu/test_requant.py tests/gpu/test_moe_wide.py
P=dsv4.kernels.moe_wide.PERM_K
T=dsv4.kernels.moe_wide.ASYNC_STORE_T
echo "tree cmp/a"; (cd cmp/a && timeout 60 python3 bench/bench_moe_flags.py --ms 2048,8192 "x:" 2>&1 | tail -2)
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,8192 "perm0:$P=0" "perm2:$P=2" "perm2T:$P=2,$T=True" \
  "perm0b:$P=0" "perm2b:$P=2" "perm2Tb:$P=2,$T=True" 2>&1 | tail -3
prefill8 80 "$P=2"
prefill8 80 "$P=2" "$T=True"
