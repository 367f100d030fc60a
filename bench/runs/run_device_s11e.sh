#!/bin/bash
# Session 11: the prefill MoE on a per-call FP8 copy of the MXFP4 experts (moe_wide.REENCODE,
# dsv4.kernels.moe_reencode: one memory-bound re-encode pass, then the FP8-expert per-group kernel with per-row
# block scales) -- its tests and the FP8 kernel's (the per-row scale option touched it), the MoE call against
# the default (bm 64 / 128 token tiles), the re-encode pass alone, and the 8K prefill with it on.
# Measured slower at every size (docs/benchmarks.md #5, session 11) and removed; the code is in commit cb8d6ae.
source "$(dirname "$0")/lib.sh"
run 60 tests/gpu/test_moe_wide.py -k "reencode"
run 150 tests/gpu/test_moe.py
timeout 120 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" \
    "reencode bm64:dsv4.kernels.moe_wide.REENCODE=True,dsv4.kernels.moe_wide.REENCODE_MIN_PAIRS_PER_EXPERT=1" \
    "reencode bm128:dsv4.kernels.moe_wide.REENCODE=True,dsv4.kernels.moe_wide.REENCODE_MIN_PAIRS_PER_EXPERT=1,dsv4.kernels.moe_wide.REENCODE_BM=128"
python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import MOE, random_experts
from dsv4.kernels.moe_reencode import reencoded_experts
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
for rb in (64,):
    ms = triton.testing.do_bench(lambda: reencoded_experts(ex), warmup=3, rep=30)
    nbytes = sum(t.numel() * t.element_size() for t in (ex.w13, ex.w13_scale, ex.w2, ex.w2_scale))
    out = 2 * (ex.w13.numel() + ex.w2.numel()) + 4 * (ex.w13_scale.numel() + ex.w2_scale.numel())
    print(f"re-encode pass, Flash experts: {ms:.3f} ms, {(nbytes + out) / ms / 1e6:.0f} GB/s (read {nbytes / 1e9:.2f} GB, write {out / 1e9:.2f} GB)")
PY
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29521
echo "--- 8K prefill of 8 Flash layers, REENCODE = True"
timeout 100 python3 bench/flags.py dsv4.kernels.moe_wide.REENCODE=True -- bench/bench_parallel.py --world 1 \
    --layers 8 --reps 2 --batches 1 --kv-dtype fp8 --prefill 8192 2>&1 | grep -E "prefill|copy"
