#!/bin/bash
# Session 32: requant's permutation done in registers (contiguous 16-byte stores again; s32c: the per-element
# destinations of 8f4ebdc compiled to 16-bit stores and cost the MoE call 0.9 ms at 2K, 2 ms at 8K). Tests, then the
# MoE call against f59efbd's tree (cmp/a) and PERM_K 0 / 2, then the 8-layer 8K prefill.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 200 tests/gpu/test_requant.py tests/gpu/test_moe_wide.py -k "requant or permute or perm_k or gluon"
P=dsv4.kernels.moe_wide.PERM_K
echo "tree cmp/a"; (cd cmp/a && timeout 60 python3 bench/bench_moe_flags.py --ms 2048,8192 "x:" 2>&1 | tail -2)
timeout 90 python3 bench/bench_moe_flags.py --ms 2048,8192 "perm0:$P=0" "perm2:$P=2" "perm0b:$P=0" "perm2b:$P=2" 2>&1 \
  | tail -3
prefill8 80 "$P=2"
prefill8 80 "$P=0"
