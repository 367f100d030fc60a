#!/bin/bash
# Session 9, call 7 (second sweep, run as bench/runs/run_device_s9g.sh): was call 6: the indexer-query glue as one tensor-core dot per 64 rows (norm_rope SIM_FP4; s9e: 2.58 ms
# per CSA layer at 8K), its GPU tests; then a launch-shape sweep of the prefill attention at Flash's 8K shapes
# (CSA: 512 picked entries per query; HCA: 64 entries; SWA: window only), ms per call, L2 not flushed.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
run() {  # pytest with a time limit; prints the summary line and any failures
  timeout $1 python3 -m pytest -q -rf --tb=line -p no:cacheprovider "${@:2}" > $OUT/pytest_$1.txt 2>&1
  grep -E "passed|failed|FAILED|Error|error:" $OUT/pytest_$1.txt | grep -vE "^[.sF]+ *\[" | tail -14
}
timeout 300 python3 - <<'PY'
import torch, triton
from dsv4.kernels import norm_rope as nr
from dsv4.kernels.prefill_attention import prefill_attention
g = torch.Generator("cuda").manual_seed(0)
t = 8192
x = torch.randn(t, 64, 128, device="cuda", generator=g).to(torch.bfloat16)
cos = torch.rand(t, 32, device="cuda", generator=g); sin = torch.rand(t, 32, device="cuda", generator=g)
ms = triton.testing.do_bench(lambda: nr.norm_rope(x, cos=cos, sin=sin, sim=nr.SIM_FP4), warmup=3, rep=20)
print(f"indexer q glue [8192, 64, 128]: {ms:.3f} ms")
h, d, win = 64, 512, 128
q = torch.randn(t, h, d, device="cuda", generator=g).to(torch.bfloat16)
keys = torch.randn(t, d, device="cuda", generator=g).to(torch.bfloat16)
sink = torch.randn(h, device="cuda", generator=g)
vis = (torch.arange(t, device="cuda") + 1) // 4
e_csa = torch.randn(t // 4, d, device="cuda", generator=g).to(torch.bfloat16)
r = torch.rand(t, t // 4, device="cuda", generator=g)
r = r.masked_fill(torch.arange(t // 4, device="cuda")[None, :] >= vis[:, None], -1)
idx_csa = torch.where(r.topk(512, dim=1).values >= 0, r.topk(512, dim=1).indices, -1).sort(1).values
e_hca = torch.randn(t // 128, d, device="cuda", generator=g).to(torch.bfloat16)
every = torch.arange(t // 128, device="cuda")[None, :]
idx_hca = torch.where(every < ((torch.arange(t, device="cuda") + 1) // 128)[:, None], every, -1)
cases = {"CSA": (e_csa, idx_csa), "HCA": (e_hca, idx_hca), "SWA": (None, None)}
shapes = [(512, 32, 8, 2), (512, 32, 8, 3), (512, 16, 8, 2), (512, 16, 8, 4), (512, 32, 4, 2), (512, 64, 4, 1)]
print("layer | " + " | ".join(f"dv{a} bn{b} w{c} s{s}" for a, b, c, s in shapes))
for name, (e, idx) in cases.items():
    row, base = [], None
    for dv, bn, w, st in shapes:
        try:
            o = prefill_attention(q, 0, keys, 0, win, e, idx, sink, 0.044, dv=dv, bn=bn, num_warps=w, num_stages=st)
            base = o if base is None else base
            err = (o.float() - base.float()).abs().max().item()
            ms = triton.testing.do_bench(lambda: prefill_attention(q, 0, keys, 0, win, e, idx, sink, 0.044, dv=dv, bn=bn,
                                                                   num_warps=w, num_stages=st), warmup=2, rep=10)
            row.append(f"{ms:.2f} ({err:.0e})")
        except Exception as ex:
            row.append("ERR " + str(ex)[:60])
    print(f"{name} | " + " | ".join(row))
PY
