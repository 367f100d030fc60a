"""The prefill MoE on bf16 tensor cores (dsv4.kernels.moe_wide): its weight widening against an exhaustive
table of (code, scale byte), and `fused_moe` with `MoEConfig(wide=True)` against `fused_moe_ref`."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture(autouse=True)
def _bf16_down(monkeypatch):
    """These tests are about the bf16 kernels (and compare them bit for bit): the FP8 down GEMM, default from
    `moe_wide.FP8_DOWN_MIN_PAIRS_PER_EXPERT` on, stays off unless a test turns it on
    (tests/gpu/test_moe.py checks the default)."""
    from dsv4.kernels import moe_wide
    monkeypatch.setattr(moe_wide, "FP8_DOWN", False)


from dsv4.kernels._triton import HAS_TRITON, tl, triton  # noqa: E402

if HAS_TRITON:
    from dsv4.kernels.moe_wide import _widen

    @triton.jit
    def _probe(CODES, SC, OUT, G: tl.constexpr, HI: tl.constexpr, USE_ASM: tl.constexpr, F16: tl.constexpr,
               BN: tl.constexpr):
        r = tl.arange(0, BN)[:, None] * 32 + tl.arange(0, 32)[None, :]
        tl.store(OUT + r, _widen(tl.load(CODES + r), tl.load(SC + tl.arange(0, BN)), G, HI, USE_ASM, F16))


def _widen_table(group: int):
    """Rows of packed bytes whose nibble of group `group` walks every e2m1 code (the other nibble random) and
    packed scale words whose byte `group` walks every scale byte the wide kernels accept, with the float64
    values they stand for."""
    from dsv4.kernels.moe_layout import WIDE_MAX_SCALE_BYTE

    rows, top = 256, WIDE_MAX_SCALE_BYTE + 1
    gen = torch.Generator().manual_seed(group)
    sbytes = torch.stack([torch.randperm(top, generator=gen)[torch.arange(rows) % top] for _ in range(4)], 1)
    words = (sbytes[:, 0] | sbytes[:, 1] << 8 | sbytes[:, 2] << 16 | sbytes[:, 3] << 24).to(torch.int32)
    codes = ((torch.arange(rows)[:, None] * 7 + torch.arange(32)[None, :]) % 16)  # every code in every row range
    other = torch.randint(0, 16, (rows, 32), generator=gen)  # the byte's other nibble must not leak in
    packed = (codes << 4 | other) if group % 2 else (other << 4 | codes)
    mag = torch.tensor(E2M1, dtype=torch.float64)[codes & 7]
    want = torch.where((codes & 8) != 0, -mag, mag) * torch.pow(2.0, sbytes[:, group:group + 1].double() - 127)
    return packed.to(torch.uint8), words, want, codes, sbytes[:, group:group + 1].expand(rows, 32)


def _assert_widened(got: torch.Tensor, want: torch.Tensor, codes: torch.Tensor, byte: torch.Tensor, flush=False):
    bad = (got != want) & ~((got == 0) & (want == 0))
    if flush:  # the interpreter's fp32 -> bf16 cast flushes bf16 subnormals
        bad &= want.abs() >= 2.0 ** -126
    assert not bool(bad.any()), f"{int(bad.sum())} wrong, e.g. code {codes[bad][0]} byte {byte[bad][0]}: " \
                                f"{got[bad][0]} != {want[bad][0]}"


@pytest.mark.parametrize("perm", [0, 1, 2])
@pytest.mark.parametrize("group", [0, 1, 2, 3])
def test_gluon_widen_exhaustive(group, perm):
    """The Gluon kernels' widening (`moe_wide_async._widen`: bf16x2 bit moves + a bf16x2 multiply per k pair,
    from spread k-pair words read out of shared memory in `pair_layout`) on the same table lands on the
    exact values in the wgmma A operand layout (bf16 subnormal weights and results included); with the pairs
    read in `pair_view` order perm, column k of the result holds `permute_pairs`'s column k."""
    if DEV != "cuda" or not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA GPU (inline PTX in a Gluon kernel)")
    from dsv4.kernels import moe_wide_async
    from dsv4.kernels.moe_wide import permute_pairs

    packed, words, want, codes, byte = _widen_table(group)
    out = torch.full(packed.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
    moe_wide_async.widen_probe[(packed.shape[0] // 64,)](packed.to(DEV), words.to(DEV), out, G=group,
                                                         HI=group % 2 == 1, PERM=perm, num_warps=4)
    want, codes, byte = (permute_pairs(t, perm) for t in (want, codes, byte))
    _assert_widened(out.cpu().double(), want, codes, byte)


@pytest.mark.parametrize("group", [0, 1, 2, 3])
@pytest.mark.parametrize("use_asm", [True, False])
@pytest.mark.parametrize("f16", [False, True])
def test_widen_exhaustive(group, use_asm, f16):
    """Every e2m1 code (both signs, in the low or the high nibble as the group's parity says) times every
    scale byte the kernel accepts (0..128, subnormal results included), picked from the packed word's
    byte `group`, equals the float64 value exactly -- through fp32 bit moves or the f16 ones."""
    if use_asm and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs no inline PTX")
    packed, words, want, codes, byte = _widen_table(group)
    rows = packed.shape[0]
    out = torch.full((rows, 32), float("nan"), dtype=torch.bfloat16, device=DEV)
    _probe[(1,)](packed.to(DEV), words.to(DEV), out, G=group, HI=group % 2 == 1, USE_ASM=use_asm, F16=f16, BN=rows)
    _assert_widened(out.cpu().double(), want, codes, byte, flush=os.environ.get("TRITON_INTERPRET") == "1")


def _wide(bm: int, warps: int = 8, maxnreg: int = 0):
    from dsv4.kernels.moe import MoEConfig

    return MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=warps, wide=True,
                     maxnreg=maxnreg)


@pytest.mark.parametrize("bm,warps,f16,maxnreg,asyn", [
    (64, 8, False, 0, False), (128, 8, False, 0, False), (64, 4, False, 0, False), (128, 8, True, 0, False),
    (64, 8, True, 128, False), (128, 8, True, 0, "reg2"), (64, 8, True, 0, "reg3"), (128, 8, True, 0, "smem3"),
    (64, 8, True, 0, "smem4"),
    # the token tiles of decode sizes (bench/sweep_moe_batch.py --wide), with the module's defaults ("default")
    (16, 8, True, 0, False), (16, 8, True, 0, "default"), (32, 8, True, 0, "default")])
@pytest.mark.parametrize("m", [1, 5, 300])
def test_fused_moe_wide(bm, warps, f16, maxnreg, asyn, m, poison, close_bf16, monkeypatch):
    """asyn: the Gluon kernel with the widening overlapped (moe_wide.ASYNC; its own bf16 widening), the widened weights
    in registers or shared memory (ASYNC_A_SMEM) and this many ring slots (ASYNC_STAGES), or "default": the
    module's own choice of both."""
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    if asyn and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    monkeypatch.setattr(moe_wide, "WIDEN_F16", f16)
    monkeypatch.setattr(moe_wide, "ASYNC", bool(asyn))
    if asyn and asyn != "default":
        monkeypatch.setattr(moe_wide, "ASYNC_A_SMEM", asyn.startswith("smem"))
        monkeypatch.setattr(moe_wide, "ASYNC_STAGES", int(asyn[-1]))
    e, d, i, k = 16, 512, 256, 6
    gen = torch.Generator(DEV).manual_seed(m * 7 + bm + warps)
    experts = _mxfp4_experts(e, d, i, gen)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _topk(m, e, k, gen, skew=m == 300)
    shared = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16) if m == 5 else None
    packed = finalize_experts(experts)
    assert packed.wide_ok  # else this would test the per-group kernel
    poison()
    y = fused_moe(x, ids, w, packed, shared=shared, config=_wide(bm, warps, maxnreg))
    close_bf16(y, fused_moe_ref(x, ids, w, experts, shared=shared), rel=1e-2, what=f"wide bm={bm} m={m}")


@pytest.mark.parametrize("asyn,a_smem", [(False, False), (True, False), (True, True)])
def test_fused_moe_wide_other_ranks_and_real_dims(asyn, a_smem, poison, close_bf16, monkeypatch):
    """Flash's D and I (a few experts), with a third of the pairs held by another rank (id -1):
    the fp32 partial sum matches the reference's (also through the Gluon kernel, asyn)."""
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    if asyn and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    monkeypatch.setattr(moe_wide, "ASYNC", asyn)
    monkeypatch.setattr(moe_wide, "ASYNC_A_SMEM", a_smem)

    e, d, i, m = 12, 4096, 2048, 70
    gen = torch.Generator(DEV).manual_seed(5)
    experts = _mxfp4_experts(e, d, i, gen)
    x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _topk(m, e, 6, gen)
    ids = torch.where(ids % 3 == 0, -1, ids)
    packed = finalize_experts(experts)
    assert packed.wide_ok
    poison()
    y = fused_moe(x, ids, w, packed, config=_wide(64), out_dtype=torch.float32)
    close_bf16(y, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2, what="wide flash dims")


def test_wide_falls_back_past_its_scale_range(poison, close_bf16):
    """A scale byte > 128 clears `wide_ok`; a wide config then runs the per-group kernel, still exact."""
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, d, i, m = 8, 512, 256, 200
    gen = torch.Generator(DEV).manual_seed(11)
    experts = _mxfp4_experts(e, d, i, gen)
    assert finalize_experts(experts).wide_ok
    experts.w2_scale[3, 7, 2] = 129  # one group of one expert: 2^2, weights up to 24
    packed = finalize_experts(experts)
    assert not packed.wide_ok
    x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _topk(m, e, 6, gen)
    poison()
    close_bf16(fused_moe(x, ids, w, packed, config=_wide(128)), fused_moe_ref(x, ids, w, experts), rel=1e-2,
               what="wide config, scales out of range")


@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("a_smem,stages,one_wg", [(False, 2, (0, 0)), (False, 3, (0, 0)), (True, 3, (0, 0)),
                                                  (True, 4, (0, 0)), (None, 4, (1, 0)), (False, 4, (1, 1)),
                                                  (True, 3, (1, 1)), (None, 4, (0, 1))])
def test_async_kernel_matches_the_wide_kernel(bm, a_smem, stages, one_wg, poison, monkeypatch):
    """The Gluon kernel (moe_wide.ASYNC) issues the same bf16 wgmma chain over the same exact operands as the
    Triton wide kernel, so its outputs agree with it (bar the MMA's internal order, if it ever differs); also
    with one warpgroup per program for the GLU and/or GEMM2 (one_wg; the GLU's z is then quantised afterwards
    by `requant_rows`); a_smem None: the default choice of where the widened weights go."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe

    e, d, i, m = 8, 1024, 512, 400
    gen = torch.Generator(DEV).manual_seed(bm)
    packed = finalize_experts(_mxfp4_experts(e, d, i, gen))
    x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _topk(m, e, 6, gen)
    monkeypatch.setattr(moe_wide, "ASYNC", False)  # the Triton kernel
    monkeypatch.setattr(moe_wide, "PERM_K", 0)  # (the weight pairs in the Triton kernel's order of k)
    want = fused_moe(x, ids, w, packed, config=_wide(bm))
    monkeypatch.setattr(moe_wide, "ASYNC", True)
    monkeypatch.setattr(moe_wide, "GLU_ONE_WARPGROUP", bool(one_wg[0]))
    monkeypatch.setattr(moe_wide, "DOWN_ONE_WARPGROUP", bool(one_wg[1]))
    monkeypatch.setattr(moe_wide, "ASYNC_STAGES", stages)
    monkeypatch.setattr(moe_wide, "ASYNC_A_SMEM", a_smem)
    poison()
    got = fused_moe(x, ids, w, packed, config=_wide(bm))
    same = float((got == want).double().mean())
    print(f"bm={bm}: {same:.6f} of outputs bit-identical")
    assert same > 0.999, same


def _skewed_moe(e: int, d: int, i: int, m: int, seed: int):
    """(packed MXFP4 experts, x [m, d], top-6 ids with a third of the pairs on another rank (-1), weights): the
    skewed-routing problem of the tests that compare two kernel paths bit for bit."""
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels.moe import finalize_experts

    gen = torch.Generator(DEV).manual_seed(seed)
    packed = finalize_experts(_mxfp4_experts(e, d, i, gen))
    x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _topk(m, e, 6, gen, skew=True)
    return packed, x, torch.where(ids % 3 == 0, -1, ids), w


@pytest.mark.parametrize("m", [3, 150, 700])
def test_mixed_tiles_match_128_row_tiles(m, poison):
    """Mixed tiles (128-row tiles over pairs of an expert's 64-row blocks, 64-row tiles for odd last blocks: two
    launches per GEMM over `mixed_tiles`' lists) compute each output with the same wgmma chain over the same
    operands as 128-row tiles: the same bits, here with skewed routing and a third of the pairs held by another
    rank (id -1)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from dsv4.kernels.moe import fused_moe

    packed, x, ids, w = _skewed_moe(8, 1024, 512, m, m)
    want = fused_moe(x, ids, w, packed, config=_wide(128), out_dtype=torch.float32)
    poison()
    got = fused_moe(x, ids, w, packed, config=dataclasses.replace(_wide(128), mixed=True), out_dtype=torch.float32)
    same = float((got == want).double().mean())
    print(f"m={m}: {same:.6f} of outputs bit-identical")
    assert same > 0.999, same


def test_mixed_tiles_need_the_gluon_kernels():
    """`moe_wide` refuses mixed tiles where the Gluon kernels do not run (CPU, interpreter); `fused_moe` keeps
    128-row tiles there."""
    if DEV == "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the refusal is for devices without the Gluon kernels")
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_align import moe_align
    from dsv4.kernels.moe_wide import moe_wide

    gen = torch.Generator(DEV).manual_seed(26)
    packed = finalize_experts(_mxfp4_experts(4, 256, 128, gen))
    x = torch.randn(3, 256, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _topk(3, 4, 2, gen)
    with pytest.raises(ValueError, match="mixed tiles need 64-row blocks"):
        moe_wide(x, *moe_align(ids, 4, 64), w, 2, packed, 10.0, bm=64, mixed=True)


@pytest.mark.parametrize("perm,m,one_wg", [(1, 300, True), (2, 300, True), (1, 700, True), (2, 700, True),
                                            (2, 300, False)])
def test_perm_k_glu_matches_the_reference(perm, m, one_wg, poison, close_bf16, monkeypatch):
    """moe_wide.PERM_K: the Gluon GLU reads its weight pairs in `pair_view` order (ldmatrix / 64-bit shared-memory
    loads) against activation columns permuted to match; the outputs match `fused_moe_ref` at the wide kernel's
    tolerance, with mixed tiles (the defaults) at Flash's D and I, also with the GLU on two warpgroups (one_wg
    False: the widened weights through shared memory). Prints the share bit-identical to PERM_K 0 (perm 1 keeps
    each wgmma's set of k, perm 2 does not)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from test_moe import _mxfp4_experts, _topk

    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, d, i = 8, 4096, 2048
    gen = torch.Generator(DEV).manual_seed(m + perm)
    experts = _mxfp4_experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _topk(m, e, 6, gen, skew=True)
    cfg = dataclasses.replace(_wide(64), mixed=True)
    monkeypatch.setattr(moe_wide, "GLU_ONE_WARPGROUP", one_wg)
    monkeypatch.setattr(moe_wide, "PERM_K", 0)
    base = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    monkeypatch.setattr(moe_wide, "PERM_K", perm)
    poison()
    got = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    print(f"perm {perm} m {m}: {float((got == base).double().mean()):.6f} of outputs bit-identical to PERM_K 0")
    close_bf16(got, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2, what=f"perm {perm}")


@pytest.mark.parametrize("bm,mixed,m", [(16, False, 5), (32, False, 40), (64, True, 700), (128, False, 400)])
def test_store_t_epilogue_is_bit_identical(bm, mixed, m, poison, monkeypatch):
    """moe_wide.ASYNC_STORE_T moves the Gluon kernels' finished tiles through shared memory before storing them:
    the same values in the same places (both GEMMs, Flash's D and I, skewed routing, a third of the pairs on
    another rank), so the outputs are bit-identical to the accumulator-layout stores."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import fused_moe

    packed, x, ids, w = _skewed_moe(8, 4096, 2048, m, m + bm)
    cfg = dataclasses.replace(_wide(bm), mixed=mixed)
    monkeypatch.setattr(moe_wide, "ASYNC", True)
    monkeypatch.setattr(moe_wide, "ASYNC_STORE_T", False)
    want = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    monkeypatch.setattr(moe_wide, "ASYNC_STORE_T", True)
    poison()
    got = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    assert torch.equal(got, want), float((got == want).double().mean())


def _spread_experts(e: int, d: int, i: int, spread: int, gen: torch.Generator):
    """Random MXFP4 experts whose group scale bytes lie in [124 - spread, 124] (re-encodable to e4m3 relative to a
    block's or tile's largest byte while spread <= 11)."""
    from test_moe import _mxfp4_experts

    experts = _mxfp4_experts(e, d, i, gen)
    for name in ("w1_scale", "w3_scale", "w2_scale"):
        s = getattr(experts, name)
        setattr(experts, name, torch.randint(124 - spread, 125, s.shape, generator=gen, device=DEV, dtype=torch.uint8))
    return experts


@pytest.mark.parametrize("m,spread,mixed,bm,which", [
    (5, 5, True, 64, "glu"), (300, 11, True, 64, "glu"), (700, 11, True, 64, "glu"), (400, 11, False, 128, "glu"),
    (200, 3, False, 64, "glu"), (300, 11, True, 64, "down"), (400, 11, False, 128, "down"), (700, 11, True, 64, "both"),
    (5, 11, True, 64, "both")])
def test_fp8_glu_matches_the_reference(m, spread, mixed, bm, which, poison, close_bf16, monkeypatch):
    """moe_wide.FP8_GLU / FP8_DOWN (dsv4.kernels.moe_glu_fp8): the GLU, the down GEMM or both on FP8 MMAs, the
    weights re-encoded per 64-row x 128-wide tile relative to its largest scale (group scales up to `spread` below
    it), one promotion per block. Matches `fused_moe_ref` at the bf16 wide kernel's tolerance (block sums are the
    tensor core's), over mixed tiles' lists (128- and 64-row programs) and plain 64- / 128-row alignments, skewed
    routing, pairs held by another rank; and it is a different computation from the bf16 one (not bit-identical)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from test_moe import _topk

    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, d, i = 8, 1024, 512
    gen = torch.Generator(DEV).manual_seed(m + spread)
    experts = _spread_experts(e, d, i, spread, gen)
    packed = finalize_experts(experts)
    assert packed.fp8_tiles_ok and packed.fp8_w2_tiles_ok and packed.wide_ok
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _topk(m, e, 6, gen, skew=m >= 300)
    ids = torch.where(ids % 3 == 0, -1, ids) if m == 700 else ids
    cfg = dataclasses.replace(_wide(bm), mixed=mixed)
    base = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    monkeypatch.setattr(moe_wide, "FP8_GLU", which != "down")
    monkeypatch.setattr(moe_wide, "FP8_DOWN", which != "glu")
    monkeypatch.setattr(moe_wide, "FP8_DOWN_MIN_PAIRS_PER_EXPERT", 0)
    assert moe_wide.fp8_glu_path(packed, x.device) == (which != "down")
    assert moe_wide.fp8_down_path(packed, x.device, ids.numel()) == (which != "glu")
    poison()
    got = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    same = float((got == base).double().mean())
    print(f"{which} m={m} spread={spread} mixed={mixed} bm={bm}: {same:.4f} of outputs bit-identical to bf16")
    assert same < 0.9
    close_bf16(got, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2,
               what=f"FP8 {which} m={m} spread={spread}")


def test_fp8_glu_declines_tiles_past_the_spread(monkeypatch):
    """A w13 tile whose group scales spread 12 below its largest cannot re-encode exactly: `fp8_tiles_ok` is False
    and moe_wide keeps the bf16 GLU even with FP8_GLU on."""
    from test_moe import _mxfp4_experts

    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts

    gen = torch.Generator(DEV).manual_seed(12)
    experts = _mxfp4_experts(4, 256, 128, gen)
    experts.w1_scale = torch.full_like(experts.w1_scale, 120)
    experts.w3_scale = torch.full_like(experts.w1_scale, 120)
    experts.w2_scale = torch.full_like(experts.w2_scale, 120)
    experts.w1_scale[2, 5] = 120 - 12  # (a whole row: each row's blocks stay uniform, only the tile spreads)
    packed = finalize_experts(experts)
    assert packed.fp8_w2_tiles_ok and not packed.fp8_tiles_ok
    monkeypatch.setattr(moe_wide, "FP8_GLU", True)
    assert not moe_wide.fp8_glu_path(packed, torch.device(DEV))


@pytest.mark.parametrize("producer_warps,producers", [(4, 1), (8, 1), (4, 2)])
@pytest.mark.parametrize("m,d,i,mixed,bm", [
    (300, 1024, 512, True, 64), (400, 1024, 512, False, 128), (700, 2048, 256, True, 64), (5, 256, 256, True, 64),
    (200, 256, 256, False, 128)])
def test_fp8_ws_is_bit_identical(m, d, i, mixed, bm, producer_warps, producers, poison, monkeypatch):
    """moe_glu_fp8.WS_GLU / WS_DOWN (dsv4.kernels.moe_fp8_ws: producer warps copy and re-encode, a consumer
    warpgroup per 64 rows multiplies and promotes, mbarrier hand-offs): the GLU and the down GEMM on FP8 give the
    shared-warp kernel's outputs bit for bit -- the same e4m3 bytes, MMAs and promotion -- over K from 2 blocks
    (fewer than the rings' slots) to 16 (the slots' phases wrap several times), mixed lists and plain alignments,
    skewed routing, pairs held by another rank, poisoned outputs; with one producer of 4 or 8 warps, or two of 4 on
    alternate blocks. (test_fp8_glu_matches_the_reference checks the shared-warp kernel against `fused_moe_ref`.)"""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from test_moe import _topk

    from dsv4.kernels import moe_fp8_ws, moe_glu_fp8, moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe

    gen = torch.Generator(DEV).manual_seed(m + d)
    experts = _spread_experts(8, d, i, 11, gen)
    packed = finalize_experts(experts)
    assert packed.fp8_tiles_ok and packed.fp8_w2_tiles_ok
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _topk(m, 8, 6, gen, skew=m >= 300)
    ids = torch.where(ids % 3 == 0, -1, ids) if m == 700 else ids
    cfg = dataclasses.replace(_wide(bm), mixed=mixed)
    monkeypatch.setattr(moe_wide, "FP8_GLU", True)
    monkeypatch.setattr(moe_wide, "FP8_DOWN", True)
    monkeypatch.setattr(moe_wide, "FP8_DOWN_MIN_PAIRS_PER_EXPERT", 0)
    monkeypatch.setattr(moe_glu_fp8, "WS_GLU", False)
    monkeypatch.setattr(moe_glu_fp8, "WS_DOWN", False)  # (the default since session 41)
    shared = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    launches, launch_ws = [], moe_fp8_ws.launch_ws

    def counted(args, grid, tile_m, *rest):
        launches.append(tile_m)
        return launch_ws(args, grid, tile_m, *rest)

    monkeypatch.setattr(moe_fp8_ws, "launch_ws", counted)
    monkeypatch.setattr(moe_glu_fp8, "WS_GLU", True)
    monkeypatch.setattr(moe_glu_fp8, "WS_DOWN", True)
    monkeypatch.setattr(moe_fp8_ws, "PRODUCER_WARPS", producer_warps)
    monkeypatch.setattr(moe_fp8_ws, "PRODUCERS", producers)
    poison()
    got = fused_moe(x, ids, w, packed, config=cfg, out_dtype=torch.float32)
    assert len(launches) >= 2 and (bm == 64 or 128 in launches), f"warp-specialized launches: {launches}"
    assert torch.isfinite(got).all()
    diff = (got != shared).sum().item()
    assert diff == 0, f"m={m} d={d} i={i} bm={bm}: {diff} of {got.numel()} outputs differ from the shared-warp kernel"
