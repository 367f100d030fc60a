"""The router's launch quantising x for the routed experts' GLU (`router.gate_route(x_quant=)`, used by
`model.moe.ROUTER_QUANTISES_X`): the stored codes and scales against `dsv4.quant.fp8.quantize_act` (the torch
reference) and bit for bit against the GLU's own quantisation launch; the routing unchanged; `moe_gemv` with
them equal to `moe_gemv` quantising x itself. Small enough for Triton's interpreter (in the Makefile's
KERNEL_TESTS); the H200 runs it with tests/gpu, plus the embedded model's logits with the switch off / on."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_moe_gemv_mma import LIMIT, _experts, _routing

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _stored_order(d: int) -> torch.Tensor:
    """Column of the stored row that holds element j of x (`moe_mma_operands._act_pos` within each 128-block: the low
    nibble tile's elements, groups 0 and 2 of 32, at 0..63, the high tile's at 64..127, each 16c + 8h + 2t + i
    for element 64h + 32 tile + 8t + 2c + i)."""
    j = torch.arange(d)
    e = j % 128
    tile, h, t, c = (e // 32) % 2, e // 64, (e // 8) % 4, (e // 2) % 4
    return (j - e) + 64 * tile + 16 * c + 8 * h + 2 * t + e % 2


def _quant_buffers(t: int, d: int):
    """x_quant buffers filled with NaN (an unwritten element shows)."""
    return (torch.full((t, d), float("nan"), dtype=torch.float16, device=DEV),
            torch.full((t, d // 128), float("nan"), dtype=torch.float32, device=DEV))


@pytest.mark.parametrize("t,e,d,mode", [(1, 16, 512, "bias"), (3, 8, 256, "hash"), (5, 64, 1024, "bias"),
                                        (6, 4, 384, "none")])
def test_gate_route_quantises_x_for_the_glu(t, e, d, mode, poison):
    """Every 128-block of every row: the f16 e4m3 codes at `_act_pos` and the fp32 power-of-two scale equal
    `quantize_act`'s (the torch reference, de-permuted by a layout written out here), and equal bit for bit the
    GLU's own launch (`moe_gemv._quant16_kernel`). The weights, ids and logits are those of the launch without
    x_quant. Small E (few expert tiles, so each program quantises several blocks) and odd rows per group too."""
    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.router import gate_route
    from dsv4.quant.fp8 import quantize_act

    g = torch.Generator(DEV).manual_seed(t * 1000 + e + d)
    x = (torch.randn(t, d, generator=g, device=DEV) * torch.exp2(torch.randint(-6, 6, (t, d // 128), generator=g,
                                                                             device=DEV)).repeat_interleave(128, 1))
    x = x.to(torch.bfloat16)
    weight = (torch.randn(e, d, generator=g, device=DEV) * 0.05).to(torch.bfloat16)
    k = min(4, e)
    args = dict(bias=(torch.randn(e, generator=g, device=DEV) * 0.1) if mode == "bias" else None)
    if mode == "hash":
        tok = torch.randint(0, 32, (t,), generator=g, device=DEV)
        t2e = torch.stack([torch.randperm(e, generator=g, device=DEV)[:k] for _ in range(32)])
        args = dict(tid2eid=t2e, token_ids=tok)
    poison()
    want = gate_route(x, weight, k, rows_per_group=2, **args)
    xq, sx = _quant_buffers(t, d)
    got = gate_route(x, weight, k, rows_per_group=2, x_quant=(xq, sx), **args)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    q, s = quantize_act(x, 128)
    assert torch.equal(sx, s), "scales differ from quantize_act's"
    codes = torch.empty_like(xq)
    codes[:, _stored_order(d)] = q.to(torch.float16)
    assert torch.equal(xq, codes), f"{int((xq != codes).sum())} codes differ from quantize_act's"
    assert (xq != 0).float().mean() > 0.5  # drawn values, not an empty row
    oq, os_ = _quant_buffers(t, d)
    ids = torch.zeros(1, dtype=torch.int32, device=DEV)
    mg._quant16_kernel[(t, d // 128)](x, oq, os_, ids, 1, x.stride(0), oq.stride(0), os_.stride(0),
                                      CHECK_IDS=False, num_warps=1)
    assert torch.equal(xq.view(torch.int16), oq.view(torch.int16)) and torch.equal(sx, os_)


def test_gate_route_rejects_bad_x_quant():
    from dsv4.kernels.router import gate_route

    x = torch.randn(2, 256, device=DEV).to(torch.bfloat16)
    w = torch.randn(8, 256, device=DEV).to(torch.bfloat16)
    xq, sx = _quant_buffers(2, 256)
    for bad in ((xq.float(), sx), (xq, sx[:, :1]), (xq[:1], sx), (xq, sx.half())):
        with pytest.raises(ValueError, match="x_quant"):
            gate_route(x, w, 2, x_quant=bad)
    x2 = torch.randn(2, 192, device=DEV).to(torch.bfloat16)  # D not a multiple of 128
    with pytest.raises(ValueError, match="x_quant"):
        gate_route(x2, w[:, :192].contiguous(), 2, x_quant=_quant_buffers(2, 128))


@pytest.mark.parametrize("split", [1, 2])
def test_moe_gemv_takes_the_routers_quantisation(split, poison, monkeypatch):
    """moe_gemv(x_quant=) from the router's launch: the same outputs bit for bit as its own quantisation launch,
    which it then skips (counted; z's re-quantisation may launch the same kernel, except where the persistent Gluon
    GLU of `moe_glu_decode` quantises z itself)."""
    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.router import gate_route

    e, d, i, k, m = 8, 512, 256, 6, 2
    gen = torch.Generator(DEV).manual_seed(17 + split)
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen)
    run = dict(bn=64, num_warps=4, unroll=2, method="mma", split=split)
    poison()
    want = mg.moe_gemv(x, ids, w, packed, LIMIT, **run)
    assert torch.isfinite(want.float()).all() and want.float().std() > 0
    xq = _quant_buffers(m, d)
    gate_route(x, (torch.randn(e, d, generator=gen, device=DEV) * 0.05).to(torch.bfloat16), k, x_quant=xq)
    launches, real = [], mg._quant16_kernel

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(mg, "_quant16_kernel", Counted())
    mg.moe_gemv(x, ids, w, packed, LIMIT, **run)
    assert (m, d // 128) in launches, launches  # the count sees x's quantisation launch
    launches.clear()
    got = mg.moe_gemv(x, ids, w, packed, LIMIT, x_quant=xq, **run)
    assert torch.equal(got, want)
    assert (m, d // 128) not in launches, launches


@pytest.mark.skipif(DEV != "cuda", reason="the model's kernel mode runs on CUDA")
def test_model_logits_same_bits_with_the_router_quantising(monkeypatch):
    """The embedded model (MXFP4 experts), prefill and greedy decode: logits bit-identical with
    ROUTER_QUANTISES_X off and on, and on, the decode steps' GLU quantisation launches are gone."""
    import dsv4
    from dsv4 import load_model
    from dsv4.kernels import moe_gemv as mg
    from dsv4.model import ForwardContext, moe, set_forward_context

    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16, kernels="triton")
    prompt = torch.randint(2, 2048, (9,), generator=torch.Generator().manual_seed(45))
    counts, real = [], mg._quant16_kernel

    class Counted:
        def __getitem__(self, grid):
            counts[-1] += int(grid[0] == 1)  # one-row x quantisations (decode steps)
            return real[grid]

    monkeypatch.setattr(mg, "_quant16_kernel", Counted())
    runs = []
    for on in (False, True):
        monkeypatch.setattr(moe, "ROUTER_QUANTISES_X", on)
        counts.append(0)
        state, out, ids, start = model.new_sequence_state(), [], prompt, 0
        with torch.no_grad():
            for _ in range(4):
                with set_forward_context(ForwardContext([ids.numel()], [state])):
                    h = model(ids.to(DEV), torch.arange(start, start + ids.numel(), device=DEV))
                    out.append(model.compute_logits(h).float().cpu())
                start += ids.numel()
                ids = out[-1][-1:].argmax(-1)
        runs.append(torch.cat(out))
    assert torch.isfinite(runs[0]).all() and torch.equal(runs[0], runs[1])
    assert counts[0] > 0 and counts[1] == 0, counts
