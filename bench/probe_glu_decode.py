"""Which part of the Gluon decode GLU faults (session 47: "illegal instruction"): each PROBE / CONSUMERS setting of
`dsv4.kernels.moe_glu_decode` launched in its own process (a fault ends the process's CUDA context), one line each."""
import subprocess
import sys

CHILD = """
import torch, sys
sys.path.insert(0, '.')
from dsv4.kernels import moe_glu_decode as g
g.PROBE, g.CONSUMERS, g.PRODUCER_WARPS = {probe}, {cons}, {pw}
from tests.gpu.test_moe_gemv_mma import _experts
from dsv4.kernels.moe import finalize_experts
e, d, i, k = 8, 2048, 256, 6
gen = torch.Generator('cuda').manual_seed(1)
packed = finalize_experts(_experts(e, d, i, gen))
xq = torch.randn(1, d, device='cuda').half(); sx = torch.rand(1, d // 128, device='cuda')
ids = torch.arange(k, device='cuda'); tw = torch.rand(k, device='cuda')
zq = torch.empty(k, i, dtype=torch.float16, device='cuda'); zs = torch.empty(k, i // 128, device='cuda')
g.glu_decode(xq, sx, ids, tw, packed, 10.0, k, zq, zs)
torch.cuda.synchronize()
print('ok', float(zs.float().abs().sum()))
"""
for probe, cons, pw in [(0, 1, 4), (8, 1, 1), (11, 1, 1), (8, 1, 4), (0, 2, 4)]:
    r = subprocess.run([sys.executable, "-c", CHILD.format(probe=probe, cons=cons, pw=pw)], capture_output=True, text=True,
                       timeout=120)
    last = (r.stdout.strip().splitlines() or ["-"])[-1] if r.returncode == 0 else \
        [ln for ln in r.stderr.splitlines() if "Error" in ln][-1:] or r.stderr[-200:]
    print(f"PROBE {probe} CONSUMERS {cons} PRODUCER_WARPS {pw}: rc {r.returncode} {last}")
