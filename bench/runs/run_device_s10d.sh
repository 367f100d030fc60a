#!/bin/bash
# Session 10: the Gluon MoE's two K loops -- widened weights as the register operand (one MMA step in flight)
# or through shared memory (one 64-wide half in flight, `ASYNC_A_SMEM`) -- both fed by the cp.async ring:
# tests, then ms per Flash MoE call (L2 flushed) against the Triton wide kernel and the default pick, then
# 8 Flash layers' 8K prefill with each Gluon mode (in-process override).
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_moe_wide.py
timeout 200 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels import moe_wide
from dsv4.kernels.moe import fused_moe, MoEConfig
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
wide = lambda bm: MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, wide=True)
variants = [("default pick", None, False, 3, 0), ("triton bm128", False, False, 3, 128), ("reg bm128 s4", True, False, 4, 128),
            ("reg bm64 s4", True, False, 4, 64), ("smem bm128 s3", True, True, 3, 128), ("smem bm128 s4", True, True, 4, 128),
            ("smem bm64 s4", True, True, 4, 64), ("smem bm64 s6", True, True, 6, 64)]
print("M | " + " | ".join(v[0] for v in variants))
for m in (1024, 2048, 4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row, base = [], None
    for name, asyn, a_smem, st, bm in variants:
        moe_wide.ASYNC, moe_wide.ASYNC_A_SMEM, moe_wide.ASYNC_STAGES = bool(asyn), a_smem, st
        cfg = wide(bm) if bm else None
        try:
            y = fused_moe(x, ids, w, ex, config=cfg)
            base = y if base is None else base
            same = float((y == base).double().mean())
            def f():
                flush.zero_()
                fused_moe(x, ids, w, ex, config=cfg)
            t = triton.testing.do_bench(f, warmup=3, rep=30) - triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
            row.append(f"{t:.2f} ({same:.3f})")
        except Exception as ex_:
            row.append("ERR " + str(ex_)[:150])
    print(f"{m} | " + " | ".join(row), flush=True)
PY
for mode in "False 4" "True 4"; do
echo "--- 8K prefill of 8 Flash layers, ASYNC on, A_SMEM/stages = $mode"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518 MODE="$mode" timeout 100 python3 - <<'PY' 2>&1 | grep -E "prefill|copy"
import os, runpy, sys
import dsv4.kernels.moe_wide as mw
a, st = os.environ["MODE"].split()
mw.ASYNC, mw.ASYNC_A_SMEM, mw.ASYNC_STAGES = True, a == "True", int(st)
sys.argv = ["bench_parallel.py", "--world", "1", "--layers", "8", "--reps", "2", "--batches", "1", "--kv-dtype", "fp8",
            "--prefill", "8192"]
runpy.run_path("bench/bench_parallel.py", run_name="__main__")
PY
done
