"""Which decode MoE stage, if any, gives other bits with `moe_gemv.SCALE_WORDS` (s33c/s33d: the Flash MoE call at
M = 4..64 differed from the byte loads in 0.01-0.08 % of outputs, where the interpreter and the small GPU tests are
bit-identical). Flash experts (256 x 4096 x 2048), the default launch of each M; for a differing stage,
the distance of each variant to `fused_moe_ref` (float64 checks are the tests' job; this only says which is off).

    python bench/probe_scale_words.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))


def main() -> None:
    from test_moe_gemv_mma import LIMIT, _experts, _routing

    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    dev = os.environ.get("DSV4_TEST_DEVICE", "cuda")  # (cpu + TRITON_INTERPRET=1 with --small: a smoke run)
    e, d, i, k = (4, 512, 256, 2) if "--small" in sys.argv else (256, 4096, 2048, 6)
    gen = torch.Generator(dev).manual_seed(1)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    for m in ((1, 4) if "--small" in sys.argv else (1, 4, 8, 16, 64)):
        x = (torch.randn(m, d, generator=gen, device=dev) * 2).to(torch.bfloat16)
        ids, w = _routing(m, e, k, gen)
        outs = {}
        for words in (False, True):
            mg.SCALE_WORDS = words
            outs[words] = fused_moe(x, ids, w, packed, swiglu_limit=LIMIT).float()
        a, b = outs[False], outs[True]
        ref = fused_moe_ref(x, ids, w, experts, swiglu_limit=LIMIT).float()
        same = float((a == b).double().mean())
        print(f"M={m}: same {same:.5f}; rel to ref bytes {float((a - ref).norm() / ref.norm()):.2e} words "
              f"{float((b - ref).norm() / ref.norm()):.2e}", flush=True)
        if same == 1.0 and not os.environ.get("PROBE_STAGES"):
            continue
        rows = (a != b).any(1).nonzero()[:, 0].tolist()
        cols = (a != b).any(0).nonzero()[:, 0]
        print(f"  rows {rows[:8]}, {len(cols)} columns, first {cols[:8].tolist()}; max |diff| "
              f"{float((a - b).abs().max()):.3e} of max |y| {float(a.abs().max()):.3e}")
        for words in (False, True):  # the GLU stage alone, same inputs
            mg.SCALE_WORDS = words
            pairs = ids.numel()
            zq = torch.zeros(pairs, i, dtype=torch.float16, device=dev)
            zs = torch.zeros(pairs, i // 128, dtype=torch.float32, device=dev)
            mg.mma_glu_stage(x, ids.reshape(-1).contiguous(), w.reshape(-1).float(), packed, LIMIT, k, zq, zs)
            outs[("z", words)] = (zq.clone(), zs.clone())
            y = torch.zeros(pairs, d, dtype=torch.bfloat16, device=dev)
            mg.mma_down_stage(*outs[("z", False)], ids.reshape(-1).contiguous(), packed, y)
            outs[("y", words)] = y.float()
        zq0, zs0 = outs[("z", False)]
        zq1, zs1 = outs[("z", True)]
        print(f"  GLU alone (bn 64, no split): zq same {float((zq0 == zq1).double().mean()):.5f}, zs same "
              f"{float((zs0 == zs1).double().mean()):.5f}; down alone on the same z: same "
              f"{float((outs[('y', False)] == outs[('y', True)]).double().mean()):.5f}")
    mg.SCALE_WORDS = False


if __name__ == "__main__":
    main()
