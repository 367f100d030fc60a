"""Decode attention over the paged FP8 cache vs the torch reference (gather + dequantise + the CPU
model's `sink_attention` + inverse RoPE) and a float64 re-derivation; fresh random pools, shuffled
page tables, partial windows, -1 padded index lists, poisoned outputs."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
REL = 2e-3 if DEV != "cpu" else 1e-2  # the CPU interpreter truncates fp32 -> bf16
HD, NOPE, WIN, RING = 512, 448, 128, 132


def _pool(pages: int, ps: int, gen: torch.Generator):
    """Random FP8 entries: e4m3 codes, E8M0 scale bytes around 2^0, bf16 rope dims."""
    from dsv4.quant.fp8 import quantize_act

    vals = torch.randn(pages * ps, NOPE, generator=gen, device=DEV)
    vals = vals * torch.exp2(torch.randint(-2, 3, (pages * ps, NOPE // 64), generator=gen,
                                           device=DEV).float()).repeat_interleave(64, 1)
    q, s = quantize_act(vals, block=64)
    sbyte = ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    rope = torch.randn(pages * ps, HD - NOPE, generator=gen, device=DEV).to(torch.bfloat16)
    return SimpleNamespace(q=q.view(pages, ps, NOPE).contiguous(), s=sbyte.view(pages, ps, -1).contiguous(),
                           rope=rope.view(pages, ps, -1).contiguous())


def _case(bsz: int, heads: int, positions: list[int], ratio: int, topk: int, gen: torch.Generator):
    from dsv4.model.rope import RotaryEmbedding
    from dsv4.config import Rope

    w_ps, c_ps = 16, 16
    w_pages = -(-RING // w_ps)
    wpool = _pool(bsz * w_pages + 3, w_ps, gen)
    wtab = torch.randperm(bsz * w_pages + 3, generator=gen, device=DEV)[: bsz * w_pages].view(bsz, w_pages)
    q = (torch.randn(bsz, heads, HD, generator=gen, device=DEV)).to(torch.bfloat16)
    pos = torch.tensor(positions, device=DEV)
    rope = RotaryEmbedding(HD - NOPE, Rope(theta=10000.0, yarn=None))
    cos, sin = rope.cos_sin(pos)
    sink = torch.randn(heads, generator=gen, device=DEV)
    cpool = ctab = cidx = ccnt = None
    if ratio:
        n_max = max(positions) // ratio + 1
        c_pages = -(-n_max // c_ps)
        cpool = _pool(bsz * c_pages + 2, c_ps, gen)
        ctab = torch.randperm(bsz * c_pages + 2, generator=gen, device=DEV)[: bsz * c_pages].view(bsz, c_pages)
        visible = [(p + 1) // ratio for p in positions]
        if ratio == 4:
            cidx = torch.full((bsz, topk), -1, dtype=torch.int32, device=DEV)
            for b, v in enumerate(visible):
                pick = torch.randperm(v, generator=gen, device=DEV)[: min(topk, v)]
                slots = torch.randperm(topk, generator=gen, device=DEV)[: pick.numel()]
                cidx[b, slots] = pick.int()
        else:
            ccnt = torch.tensor(visible, device=DEV)
    return dict(q=q, pos=pos, cos=cos.to(DEV), sin=sin.to(DEV), window_pool=wpool, window_table=wtab, ring=RING,
                window=WIN, comp_pool=cpool, comp_table=ctab, comp_idx=cidx, comp_count=ccnt, sink=sink,
                scale=HD ** -0.5)


def _f64(args) -> torch.Tensor:
    """float64 re-derivation of spec §2.5 from the dequantised candidates (no bf16 probability rounding)."""
    from dsv4.kernels.attention import _gather
    out = []
    for b in range(args["q"].shape[0]):
        t = int(args["pos"][b])
        kp = torch.arange(max(0, t - WIN + 1), t + 1, device=DEV)
        keys = [_gather(args["window_pool"], args["window_table"][b], kp % RING)]
        if args["comp_pool"] is not None:
            idx = (args["comp_idx"][b][args["comp_idx"][b] >= 0].long() if args["comp_idx"] is not None
                   else torch.arange(int(args["comp_count"][b]), device=DEV))
            keys.append(_gather(args["comp_pool"], args["comp_table"][b], idx))
        v = torch.cat(keys).double()
        s = args["q"][b].double() @ v.T * args["scale"]
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - m)
        o = (e @ v) / (e.sum(-1, keepdim=True) + torch.exp(args["sink"].double()[:, None] - m))
        c, sn = args["cos"][b].double(), args["sin"][b].double()
        ev, od = o[:, NOPE::2].clone(), o[:, NOPE + 1::2].clone()
        o[:, NOPE::2], o[:, NOPE + 1::2] = ev * c + od * sn, od * c - ev * sn
        out.append(o)
    return torch.stack(out)


CASES = [  # (heads, positions, ratio, topk, splits)
    (64, [5], 0, 0, None),
    (64, [1000, 37], 4, 512, None),
    (64, [3000, 130, 2047], 4, 512, 1),
    (64, [70000, 4095], 128, 0, None),
    (20, [255, 127, 128, 6000], 128, 0, 3),
    (64, [8191] * 8, 4, 512, None),
]
if DEV == "cpu":
    CASES = [(4, [5], 0, 0, None), (4, [200, 37], 4, 16, None), (4, [300], 4, 8, 1), (3, [600, 127], 128, 0, 2)]


@pytest.mark.parametrize("heads,positions,ratio,topk,splits", CASES)
def test_decode_attention(heads, positions, ratio, topk, splits, poison, close_bf16):
    from dsv4.kernels.attention import decode_attention, decode_attention_ref

    gen = torch.Generator(DEV).manual_seed(heads + sum(positions) + ratio)
    args = _case(len(positions), heads, positions, ratio, topk, gen)
    poison()
    out = decode_attention(**args, splits=splits)
    ref = decode_attention_ref(**args)
    close_bf16(out, ref, rel=REL, what="vs reference")
    close_bf16(out, _f64(args).to(torch.bfloat16), rel=2 * REL, what="vs float64")


def test_rejects_bf16_pool():
    from dsv4.kernels.attention import decode_attention

    gen = torch.Generator(DEV).manual_seed(1)
    args = _case(1, 4, [10], 0, 0, gen)
    args["window_pool"] = SimpleNamespace(q=args["window_pool"].rope, s=args["window_pool"].s,
                                          rope=args["window_pool"].rope)
    with pytest.raises(ValueError, match="window_pool"):
        decode_attention(**args)


class _Spy:
    """Wraps a Triton kernel: records (grid, n_split) of each launch and forwards it."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((grid, args[7]))
            return self.kernel[grid](*args, **kw)
        return launch


# (heads, topk, splits, rotate): WIN + topk candidates make exactly `splits` 16-entry-aligned splits; heads are
# not a multiple of the wide kernel's head block (8, 16, 4, 4 for these split counts); the second sequence has
# a partial window and a mostly -1 index list, so some of its splits are empty.
WIDE_CASES = [(5, 16, 2, True), (20, 16, 5, False), (3, 192, 20, True), (5, 400, 33, False), (6, 400, 33, True)]


@pytest.mark.parametrize("heads,topk,splits,rotate", WIDE_CASES)
def test_wide_combine(heads, topk, splits, rotate, poison, close_bf16, monkeypatch):
    from dsv4.kernels import attention

    gen = torch.Generator(DEV).manual_seed(100 * splits + heads)
    args = _case(2, heads, [2000, 37], 4, topk, gen)
    if not rotate:
        args["cos"] = args["sin"] = None
    spy = _Spy(attention._combine_wide_kernel)
    monkeypatch.setattr(attention, "_combine_wide_kernel", spy)
    poison()
    out = torch.full_like(args["q"], float("nan"))  # every element must be written
    wide = attention.decode_attention(**args, splits=splits, combine="wide", out=out)
    assert len(spy.calls) == 1 and spy.calls[0][1] == splits, spy.calls
    poison()
    loop = attention.decode_attention(**args, splits=splits, combine="loop")
    assert len(spy.calls) == 1
    close_bf16(wide, loop, rel=2e-3, what="wide vs loop combine")
    # same fp32 math up to the order of the split sum: all but a few bf16 rounding flips are bit-equal
    assert (wide != loop).float().mean().item() < 0.01
    close_bf16(wide, attention.decode_attention_ref(**args), rel=REL, what="wide vs reference")
    if rotate:
        close_bf16(wide, _f64(args).to(torch.bfloat16), rel=2 * REL, what="wide vs float64")


def test_combine_switch(monkeypatch):
    from dsv4.kernels import attention

    gen = torch.Generator(DEV).manual_seed(7)
    args = _case(1, 4, [300], 4, 16, gen)
    spy = _Spy(attention._combine_wide_kernel)
    monkeypatch.setattr(attention, "_combine_wide_kernel", spy)
    monkeypatch.setattr(attention, "COMBINE", "wide")
    by_default = attention.decode_attention(**args, splits=3)  # combine=None follows the module switch
    assert [c[1] for c in spy.calls] == [3]
    loop = attention.decode_attention(**args, splits=3, combine="loop")
    assert len(spy.calls) == 1
    assert (by_default != loop).float().mean().item() < 0.01
    with pytest.raises(ValueError, match="combine"):
        attention.decode_attention(**args, combine="serial")


@pytest.mark.parametrize("combine,splits", [("loop", 1), ("loop", 3), ("wide", 3)])
def test_inverse_rope_in_kernel_is_norm_rope(combine, splits, poison):
    """The paged decode step lets the kernel apply the inverse RoPE (Attention.step_kernel): the same bits
    as the kernel without it followed by `norm_rope(inverse=True)` (what `Attention.finish` runs otherwise)."""
    from dsv4.kernels import attention
    from dsv4.kernels.norm_rope import norm_rope

    gen = torch.Generator(DEV).manual_seed(11 * splits + len(combine))
    args = _case(2, 5, [1500, 201], 4, 48, gen)
    poison()
    rotated = attention.decode_attention(**args, splits=splits, combine=combine)
    cos, sin = args["cos"], args["sin"]
    args["cos"] = args["sin"] = None
    poison()
    plain = attention.decode_attention(**args, splits=splits, combine=combine)
    assert torch.equal(rotated, norm_rope(plain, cos=cos, sin=sin, inverse=True))


@pytest.mark.parametrize("splits,rotate", [(1, True), (3, True), (2, False)])
def test_q_norm_in_kernel_is_norm_rope(splits, rotate, poison, close_bf16):
    """`decode_attention(q_norm=)` (attention.DECODE_Q_NORM_IN_KERNEL: sliding / HCA layers' paged decode step)
    against `norm_rope`'s q heads' norm + RoPE followed by the kernel: the same bits up to the fp32 order of a
    head's sum of squares (rarely across a bf16 rounding of its mean), and against the reference with q_norm."""
    from dsv4.kernels import attention
    from dsv4.kernels.norm_rope import UNWEIGHTED, norm_rope

    gen = torch.Generator(DEV).manual_seed(5 * splits + rotate)
    args = _case(3, 5, [1500, 201, 9], 128, 0, gen)
    raw = (args["q"].float() * 3 + 0.5).to(torch.bfloat16)  # before the norm: not unit-scale
    cos, sin = args["cos"], args["sin"]
    if not rotate:
        args["cos"] = args["sin"] = None
    args["q"] = norm_rope(raw, norm=UNWEIGHTED, eps=1e-6, cos=cos, sin=sin)
    poison()
    want = attention.decode_attention(**args, splits=splits)
    args["q"] = raw
    poison()
    got = attention.decode_attention(**args, splits=splits, q_norm=(1e-6, cos, sin))
    same = float((got == want).double().mean())
    print(f"splits={splits} rotate={rotate}: {same:.4f} of the outputs bit-identical to norm_rope + kernel")
    assert same > 0.99
    close_bf16(got, want, rel=REL)
    ref = attention.decode_attention_ref(**args, q_norm=(1e-6, cos, sin))
    close_bf16(got, ref, rel=REL)
    with pytest.raises(ValueError, match="q_norm must be"):
        attention.decode_attention(**args, q_norm=(1e-6, cos[:1], sin[:1]))
