"""The per-pair MXFP4 MoE's down (W2) kernel with a launch of its own (`moe_gemv`'s down_stages / down_dot_blocks,
`MoEConfig.gemv_down_stages` / `gemv_down_dot_blocks`; session 79's two-pair launches): the same bits as the down
with the GLU's launch (neither the pipeline depth nor the K blocks per tl.dot reorder a row's sums), close to the
reference through fused_moe, and bad values refused. Small enough for `make test`'s interpreter list (≈ 1 min)."""

from __future__ import annotations

import pytest
import torch
from test_moe_gemv_mma import DEV, LIMIT, _experts, _gpu_like_casts, _routing, _tiny_inputs  # noqa: F401  (fixture)


@pytest.mark.parametrize("pairs", [1, 2])
@pytest.mark.parametrize("down", [dict(down_stages=2), dict(down_dot_blocks=2),
                                  dict(down_stages=4, down_dot_blocks=1)])
def test_down_launch_same_bits(pairs, down, poison, close_bf16, monkeypatch):
    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe, fused_moe_ref
    from dsv4.kernels.moe_gemv import moe_gemv

    seen = []  # the down launches' (num_stages, dot_blocks): the override reaches the kernel
    stage = mg.mma_down_stage

    def recorded(*args, **kw):
        seen.append((kw["num_stages"], kw["dot_blocks"]))
        return stage(*args, **kw)

    monkeypatch.setattr(mg, "mma_down_stage", recorded)

    e, d, i, k, m = 8, 256, 256, 6, 4  # (2 K blocks in either GEMM: a dot of 2 blocks is one of the launches)
    gen = torch.Generator(DEV).manual_seed(17 * pairs + len(down) + down.get("down_stages", 0))
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen)
    # the GLU's launch: 2 K blocks per loop step, 2 per dot where the override asks for 1 (and the reverse)
    launch = dict(bn=64, num_warps=4, unroll=2, dot_blocks=2 if down.get("down_dot_blocks") == 1 else 1,
                  num_stages=3, pairs_per_program=pairs)
    poison()
    same = moe_gemv(x, ids, w, packed, LIMIT, method="mma", **launch)
    poison()
    own = moe_gemv(x, ids, w, packed, LIMIT, method="mma", **launch, **down)
    assert torch.equal(same.view(torch.int16), own.view(torch.int16)), f"{down}, {pairs} pair(s): bits differ"
    expect = (down.get("down_stages") or 3, down.get("down_dot_blocks") or launch["dot_blocks"])
    assert seen == [(3, launch["dot_blocks"]), expect], seen
    cfg = MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                    gemv_unroll=2, gemv_dot_blocks=launch["dot_blocks"], gemv_pairs=pairs,
                    gemv_down_stages=down.get("down_stages", 0), gemv_down_dot_blocks=down.get("down_dot_blocks", 0))
    y = fused_moe(x, ids, w, packed, out_dtype=torch.float32, config=cfg)
    close_bf16(y, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2, what=f"{down} {pairs}")


def test_down_launch_rejects_bad_values():
    from dsv4.kernels.moe_gemv import moe_gemv

    packed, x, ids, w = _tiny_inputs(5)
    for bad, what in ((dict(down_dot_blocks=3), "dot_blocks"), (dict(unroll=1, down_dot_blocks=2), "dot_blocks"),
                      (dict(down_stages=-1), "down_stages")):
        with pytest.raises(ValueError, match=what):
            moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", **bad)
