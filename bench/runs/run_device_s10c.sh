#!/bin/bash
# Session 10: the Gluon MoE rewritten with the weight bytes through its cp.async ring (s10a: the synchronous
# weight loads made it 1.6-1.7x slower than the Triton kernel): tests, A/B at Flash shapes (L2 flushed), then
# 8 Flash layers' 8K prefill with it on (in-process override) and off; and the prefill attention's new
# defaults (KV_ONE_LOAD, 64-key tiles) through their tests.
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_moe_wide.py
run 90 tests/gpu/test_prefill_attention.py
timeout 150 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels import moe_wide
from dsv4.kernels.moe import fused_moe, MoEConfig
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
wide = lambda bm: MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, wide=True)
variants = [("triton bm128", False, 3, 128), ("ring bm128 s2", True, 2, 128), ("ring bm128 s3", True, 3, 128),
            ("ring bm128 s4", True, 4, 128), ("ring bm64 s4", True, 4, 64), ("triton bm64", False, 3, 64)]
print("M | " + " | ".join(v[0] for v in variants))
for m in (1024, 2048, 4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row, base = [], None
    for name, asyn, st, bm in variants:
        moe_wide.ASYNC, moe_wide.ASYNC_STAGES = asyn, st
        try:
            y = fused_moe(x, ids, w, ex, config=wide(bm))
            base = y if base is None else base
            same = float((y == base).double().mean())
            def f():
                flush.zero_()
                fused_moe(x, ids, w, ex, config=wide(bm))
            t = triton.testing.do_bench(f, warmup=3, rep=30) - triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
            row.append(f"{t:.2f} ({same:.4f} same)")
        except Exception as ex_:
            row.append("ERR " + str(ex_)[:120])
    print(f"{m} | " + " | ".join(row), flush=True)
PY
echo "--- 8K prefill of 8 Flash layers, ASYNC on (ring s3), then the default"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518 timeout 100 python3 - <<'PY' 2>&1 | grep -E "prefill|copy"
import runpy, sys
import dsv4.kernels.moe_wide as mw
mw.ASYNC = True
sys.argv = ["bench_parallel.py", "--world", "1", "--layers", "8", "--reps", "2", "--batches", "1", "--kv-dtype", "fp8",
            "--prefill", "8192"]
runpy.run_path("bench/bench_parallel.py", run_name="__main__")
PY
timeout 100 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 2 --batches 1 --kv-dtype fp8 --prefill 8192 \
    2>&1 | grep -E "prefill|copy"
