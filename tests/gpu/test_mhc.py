"""mHC Triton kernels vs float64 re-derivations of spec §2.2 / §2.10 (via the CPU model functions on
float64 inputs) and vs the bf16 torch references; fresh random inputs, poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
KW = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
# (tokens, hidden): decode sizes, a prefill block and Flash width
SHAPES = [(1, 256), (5, 128), (70, 512), (3, 4096), (64, 4096), (1000, 4096)]
REL = 2e-3  # bf16 results of the same fp32 math
if DEV == "cpu":  # Triton interpreter: tiny shapes only; it truncates fp32 -> bf16 instead of rounding
    SHAPES = [(1, 64), (5, 128), (19, 64)]
    REL = 1e-2


def _streams(t: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Four streams with different magnitudes per stream and token (never zeros)."""
    mag = torch.exp2(torch.randint(-3, 4, (t, 4, 1), generator=gen, device=DEV).float())
    return (torch.randn(t, 4, d, generator=gen, device=DEV) * mag).to(torch.bfloat16)


def _params(n_mix: int, n_scale: int, d: int, gen: torch.Generator):
    # |fn . xhat| ~ sqrt(4d) * 0.02 / ... keeps the sigmoids and the Sinkhorn logits in a live range
    fn = torch.randn(n_mix, 4 * d, generator=gen, device=DEV) * (2.0 / (4 * d) ** 0.5)
    base = torch.randn(n_mix, generator=gen, device=DEV) * 0.5
    scale = torch.rand(n_scale, generator=gen, device=DEV) + 0.5
    return fn, base, scale


def _f64_pre(x, fn, base, scale):
    from dsv4.model.hyper import hc_pre as model_pre
    return model_pre(x.double(), fn.double(), base.double(), scale.double(), **KW)


def _rel(y, ref) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("t,d", SHAPES)
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("trans", [False, True])
def test_hc_pre(t, d, with_norm, trans, poison, close_bf16, monkeypatch):
    """trans: the prefill mix as the transposed product (`mhc.MIX_TRANS`; only above 16 tokens)."""
    from dsv4.kernels import mhc
    from dsv4.kernels.mhc import hc_pre, hc_pre_ref

    monkeypatch.setattr(mhc, "MIX_TRANS", trans)

    gen = torch.Generator(DEV).manual_seed(t * 131 + d + with_norm)
    x = _streams(t, d, gen)
    fn, base, scale = _params(24, 3, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16) if with_norm else None
    poison()
    u, post, comb = hc_pre(x, fn, base, scale, norm_weight=w, **KW)
    _, post64, comb64 = _f64_pre(x, fn, base, scale)
    assert torch.isfinite(post).all() and torch.isfinite(comb).all()
    assert _rel(post, post64) < 1e-5, "post"
    assert _rel(comb, comb64) < 1e-4, "comb"
    # the last Sinkhorn step is a column normalisation: columns sum to ~1
    assert torch.allclose(comb.sum(1), torch.ones_like(comb.sum(1)), atol=1e-4)
    u_ref, post_ref, comb_ref = hc_pre_ref(x, fn, base, scale, norm_weight=w, **KW)
    close_bf16(u, u_ref, rel=REL, what="collapsed input")
    assert _rel(comb, comb_ref) < 1e-4


@pytest.mark.parametrize("t,d", SHAPES)
def test_hc_post(t, d, poison, close_bf16):
    from dsv4.kernels.mhc import hc_post, hc_post_ref

    gen = torch.Generator(DEV).manual_seed(7 * t + d)
    x = _streams(t, d, gen)
    f = torch.randn(t, d, generator=gen, device=DEV).to(torch.bfloat16)
    post = torch.rand(t, 4, generator=gen, device=DEV) * 2
    comb = torch.rand(t, 4, 4, generator=gen, device=DEV)
    poison()
    y = hc_post(f, x, post, comb)
    # float64 re-derivation: X'_k = post_k f + sum_j comb[j, k] X_j (comb indexed [source, destination])
    ref64 = post.double()[:, :, None] * f.double()[:, None, :] + torch.einsum(
        "tjk,tjd->tkd", comb.double(), x.double())
    close_bf16(y, ref64.to(torch.bfloat16), rel=REL, what="hc_post vs float64")
    close_bf16(y, hc_post_ref(f, x, post, comb), rel=REL, what="hc_post vs ref")


@pytest.mark.parametrize("t,d", SHAPES)
@pytest.mark.parametrize("trans", [False, True])
def test_hc_post_pre(t, d, trans, poison, close_bf16, monkeypatch):
    from dsv4.kernels import mhc
    from dsv4.kernels.mhc import hc_post_pre, hc_post_pre_ref, prepare_mix

    monkeypatch.setattr(mhc, "MIX_TRANS", trans)

    gen = torch.Generator(DEV).manual_seed(11 * t + d)
    x = _streams(t, d, gen)
    f = torch.randn(t, d, generator=gen, device=DEV).to(torch.bfloat16)
    _, post0, comb0 = _f64_pre(x, *_params(24, 3, d, gen))
    post0, comb0 = post0.float(), comb0.float()
    fn, base, scale = _params(24, 3, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16)
    poison()
    xn, u, post, comb = hc_post_pre(f, x, post0, comb0, prepare_mix(fn), base, scale, norm_weight=w, **KW)
    xr, ur, post_r, comb_r = hc_post_pre_ref(f, x, post0, comb0, fn, base, scale, norm_weight=w, **KW)
    close_bf16(xn, xr, rel=REL, what="post output")
    _, post64, comb64 = _f64_pre(xn, fn, base, scale)  # pre of exactly what the kernel wrote
    assert _rel(post, post64) < 1e-5 and _rel(comb, comb64) < 1e-4
    close_bf16(u, ur, rel=REL, what="normed input")


@pytest.mark.parametrize("t,d", SHAPES)
@pytest.mark.parametrize("with_norm", [False, True])
def test_hc_head(t, d, with_norm, poison, close_bf16):
    from dsv4.kernels.mhc import hc_head, hc_head_ref
    from dsv4.model.hyper import hc_head as model_head

    gen = torch.Generator(DEV).manual_seed(5 * t + d + with_norm)
    x = _streams(t, d, gen)
    fn, base, scale = _params(4, 1, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16) if with_norm else None
    poison()
    y = hc_head(x, fn, base, scale, hc_eps=1e-6, norm_eps=1e-6, norm_weight=w)
    y64 = model_head(x.double(), fn.double(), base.double(), scale.double(), hc_eps=1e-6, norm_eps=1e-6)
    if w is not None:  # spec §2.10: y is rounded to bf16, then RMSNorm_norm
        y64 = y64.to(torch.bfloat16).double()
        y64 = w.double() * y64 * torch.rsqrt(y64.square().mean(-1, keepdim=True) + 1e-6)
    close_bf16(y, y64.to(torch.bfloat16), rel=REL, what="hc_head vs float64")
    close_bf16(y, hc_head_ref(x, fn, base, scale, hc_eps=1e-6, norm_eps=1e-6, norm_weight=w), rel=REL, what="hc_head vs ref")


def test_bad_input_names_tensor():
    from dsv4.kernels.mhc import hc_pre

    x = torch.randn(2, 3, 64, device=DEV).to(torch.bfloat16)  # 3 streams instead of 4
    with pytest.raises(ValueError, match="mHC x"):
        hc_pre(x, torch.randn(24, 192, device=DEV), torch.randn(24, device=DEV), torch.rand(3, device=DEV), **KW)


# --------------------------------------------------------------------------- collapse="split" finish
# The split finish collapses each token's row in SPLIT_BD-column chunks, one program each; with a norm the
# token's last chunk to arrive (per-token counter) normalises the row. The small width runs with 64-column
# chunks (3 chunks, the last one partial) so the counter path is exercised at interpreter sizes too.
SMALL_D = 176
SPLIT_CASES = [(op, t, d, nw) for op in ("pre", "post_pre", "head") for t in (1, 3, 64)
               for d in (SMALL_D, 4096, 7168) for nw in (False, True)]
if DEV == "cpu":  # the interpreter takes seconds per 4096-column mix or 64-token finish: one such case
    SPLIT_CASES = [c for c in SPLIT_CASES if c[2] == SMALL_D and c[1] < 64] + [("pre", 1, 4096, True)]


def _split_setup(op: str, t: int, d: int, with_norm: bool, monkeypatch):
    """Inputs of one case, and `call(collapse)` returning (u or normed u, *the other outputs)."""
    from dsv4.kernels import mhc

    if d == SMALL_D:
        monkeypatch.setattr(mhc, "SPLIT_BD", 64)
        monkeypatch.setattr(mhc, "NORM_BD", 64)
    gen = torch.Generator(DEV).manual_seed(1000 * t + d + 7 * with_norm + len(op))
    x = _streams(t, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16) if with_norm else None
    if op == "head":
        fn, base, scale = _params(4, 1, d, gen)
        kw = dict(hc_eps=1e-6, norm_eps=1e-6, norm_weight=w)
        return (lambda c: (mhc.hc_head(x, fn, base, scale, collapse=c, **kw),),
                lambda: (mhc.hc_head_ref(x, fn, base, scale, **kw),), (x, fn, base, scale, w))
    fn, base, scale = _params(24, 3, d, gen)
    mix = mhc.prepare_mix(fn)
    if op == "pre":
        return (lambda c: mhc.hc_pre(x, mix, base, scale, norm_weight=w, collapse=c, **KW),
                lambda: mhc.hc_pre_ref(x, fn, base, scale, norm_weight=w, **KW), (x, fn, base, scale, w))
    f = torch.randn(t, d, generator=gen, device=DEV).to(torch.bfloat16)
    _, post0, comb0 = _f64_pre(x, *_params(24, 3, d, gen))
    post0, comb0 = post0.float(), comb0.float()

    def call(c):
        xn, u, post, comb = mhc.hc_post_pre(f, x, post0, comb0, mix, base, scale, norm_weight=w, collapse=c, **KW)
        return u, post, comb, xn

    def ref():
        xn, u, post, comb = mhc.hc_post_pre_ref(f, x, post0, comb0, fn, base, scale, norm_weight=w, **KW)
        return u, post, comb, xn

    return call, ref, (None, fn, base, scale, w)


def _u64(op: str, x, fn, base, scale, w) -> torch.Tensor:
    """float64 re-derivation of the collapse (spec §2.2 / §2.10), rounded to bf16, then RMSNorm_w in float64."""
    from dsv4.model.hyper import hc_head as model_head

    if op == "head":
        u = model_head(x.double(), fn.double(), base.double(), scale.double(), hc_eps=1e-6, norm_eps=1e-6)
    else:
        u = _f64_pre(x, fn, base, scale)[0]
    u = u.to(torch.bfloat16)
    if w is None:
        return u
    u = u.double()
    return (w.double() * u * torch.rsqrt(u.square().mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)


def _within_one_ulp(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """bf16 results whose fp32 inputs differ only in the last bits of a common factor: rare 1-ulp flips."""
    a, b = a.float(), b.float()
    diff = (a - b).abs()
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(a.abs(), b.abs()).clamp_min(1e-30))) - 7)
    assert bool((diff <= ulp).all()), f"{what}: more than one bf16 ulp apart"
    assert float((diff > 0).float().mean()) < 0.01, f"{what}: too many rounding flips"


@pytest.mark.parametrize("op,t,d,with_norm", SPLIT_CASES)
def test_split_collapse(op, t, d, with_norm, poison, close_bf16, monkeypatch):
    call, ref, (x, fn, base, scale, w) = _split_setup(op, t, d, with_norm, monkeypatch)
    poison()
    split = call("split")
    poison()
    row = call("row")
    refs = ref()
    close_bf16(split[0], refs[0], rel=REL, what=f"{op} split vs ref")
    if op == "post_pre":
        assert torch.equal(split[3], row[3]), "post output"
        x = split[3]  # pre of exactly what the kernel wrote
    close_bf16(split[0], _u64(op, x, fn, base, scale, w), rel=REL, what=f"{op} split vs float64")
    if op != "head":
        _, post64, comb64 = _f64_pre(x, fn, base, scale)
        assert _rel(split[1], post64) < 1e-5 and _rel(split[2], comb64) < 1e-4
        assert torch.equal(split[1], row[1]) and torch.equal(split[2], row[2]), "post/comb differ from row"
    # same u bits as the row finish; the norm only sums the squares in another fp32 order
    if with_norm:
        _within_one_ulp(split[0], row[0], f"{op} split vs row")
    else:
        assert torch.equal(split[0], row[0]), f"{op}: split u differs from row u"


@pytest.mark.parametrize("op,d", [("pre", SMALL_D), ("head", SMALL_D)]
                         + ([("post_pre", 4096), ("pre", 7168)] if DEV == "cuda" else []))
def test_row_finish_in_chunks_matches_one_pass(op, d, poison, monkeypatch):
    """The "row" finish takes a row of up to ROW_ONE_PASS_MAX columns in one chunk (its norm from the u in
    registers); wider rows go in chunks, collapsing X twice with a norm. Both give the same u, post and comb
    bits and a normed row within one ulp (the sum of squares in another order); several chunks on the GPU."""
    from dsv4.kernels import mhc

    call, _, _ = _split_setup(op, 5, d, True, monkeypatch)
    poison()
    one = call("row")
    monkeypatch.setattr(mhc, "ROW_ONE_PASS_MAX", 64)  # 1024-column chunks (SMALL_D: one partial chunk)
    poison()
    chunks = call("row")
    _within_one_ulp(one[0], chunks[0], f"{op} row: normed, one pass vs chunks")
    for a, b in zip(one[1:], chunks[1:]):
        assert torch.equal(a, b), f"{op} row: post / comb / X' differ between one pass and chunks"


def test_prefill_sizes_pick_collapse_prefill(monkeypatch):
    """Calls above 16 tokens that name no finish take COLLAPSE_PREFILL, up to 16 tokens COLLAPSE."""
    from dsv4.kernels import mhc

    monkeypatch.setattr(mhc, "COLLAPSE_PREFILL", "bogus")
    gen = torch.Generator(DEV).manual_seed(16)
    fn, base, scale = _params(24, 3, 64, gen)
    with pytest.raises(ValueError, match="'bogus'"):
        mhc.hc_pre(_streams(17, 64, gen), fn, base, scale, **KW)
    u = mhc.hc_pre(_streams(16, 64, gen), fn, base, scale, **KW)[0]
    assert u.shape == (16, 64)


ROWS_CASES = [(op, t, d, nw) for op in ("post_pre", "head") for t in (1, 3) for d in (256, 4096)
              for nw in (False, True)]
if DEV == "cpu":
    ROWS_CASES = [c for c in ROWS_CASES if c[2] == 256 and c[3]]


@pytest.mark.parametrize("op,t,d,with_norm", ROWS_CASES)
def test_rows_mix_matches_dot_mix(op, t, d, with_norm, poison, close_bf16, monkeypatch):
    """The CUDA-core mix (`_mix_rows_kernel`, here up to 3 tokens): the fused post's X' has the dot mix's bits
    (the same expression), post / comb / u agree to fp32 summation order, and both match float64."""
    from dsv4.kernels import mhc
    call, ref, (x, fn, base, scale, w) = _split_setup(op, t, d, with_norm, monkeypatch)
    monkeypatch.setattr(mhc, "ROWS_MAX_T", 3)
    poison()
    rows = call("split")
    monkeypatch.setattr(mhc, "ROWS_MAX_T", 0)
    poison()
    dots = call("split")
    if op == "post_pre":
        assert torch.equal(rows[3], dots[3]), "X' differs from the dot mix's"
        x = rows[3]
        _, post64, comb64 = _f64_pre(x, fn, base, scale)
        assert _rel(rows[1], post64) < 1e-5 and _rel(rows[2], comb64) < 1e-4
        assert _rel(rows[1], dots[1]) < 1e-5 and _rel(rows[2], dots[2]) < 1e-4
    close_bf16(rows[0], _u64(op, x, fn, base, scale, w), rel=REL, what=f"{op} rows mix vs float64")
    close_bf16(rows[0], dots[0], rel=REL, what=f"{op} rows mix vs dot mix")
    close_bf16(rows[0], ref()[0], rel=REL, what=f"{op} rows mix vs ref")


def _counters_zero() -> bool:
    from dsv4.kernels import _triton

    return all(int(b.count_nonzero()) == 0 for bufs in _triton._counter_cache.values() for b in bufs)


@pytest.mark.parametrize("op", ["pre", "head"])
def test_split_repeated_calls_identical(op, poison, monkeypatch):
    """Back-to-back launches (and, on CUDA, graph replays) reuse the counters: each leaves them at zero."""
    call, _, _ = _split_setup(op, 3, SMALL_D, True, monkeypatch)
    poison()
    first = call("split")
    assert _counters_zero()
    for _ in range(19):
        assert all(torch.equal(a, b) for a, b in zip(call("split"), first))
    assert _counters_zero()
    if DEV == "cuda":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [call("split") for _ in range(20)]
        for _ in range(2):
            g.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(a, b) for o in outs for a, b in zip(o, first))
        assert _counters_zero()


def test_bad_collapse_names_keyword():
    from dsv4.kernels.mhc import hc_head

    x = torch.randn(2, 4, 64, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match="collapse"):
        hc_head(x, torch.randn(4, 256, device=DEV), torch.randn(4, device=DEV), torch.rand(1, device=DEV),
                hc_eps=1e-6, norm_eps=1e-6, collapse="rows")


@pytest.mark.parametrize("op,d", [("post_pre", 256), ("head", 256)] + ([("post_pre", 4096)] if DEV == "cuda" else []))
def test_rows_fn_early_same_bits(op, d, poison, monkeypatch):
    """mhc.ROWS_FN_EARLY (one token, one step per program: the rows mix's fn tiles loaded before the PDL wait) feeds
    the same values to the same FMAs: every output bit-identical to the in-loop loads."""
    from dsv4.kernels import mhc
    call, _, _ = _split_setup(op, 1, d, True, monkeypatch)
    outs = []
    for early in (False, True):
        monkeypatch.setattr(mhc, "ROWS_FN_EARLY", early)
        poison()
        outs.append(call("split"))
    for a, b in zip(*outs):
        assert torch.equal(a, b), f"{op} d={d}: {int((a != b).sum())} of {a.numel()} outputs differ"


@pytest.mark.parametrize("op,t,d", [("pre", 1, SMALL_D), ("post_pre", 3, SMALL_D)]
                         + ([("pre", 1, 4096), ("post_pre", 1, 7168)] if DEV == "cuda" else []))
def test_norm_one_step_same_bits(op, t, d, poison, monkeypatch):
    """The split finish's last arriver normalising the row in one step (up to mhc.NORM_ONE_MAX columns, its u and
    weight loads issued before the partial sums) computes each normed value by the same expression: bit-identical to
    the stepped pass (NORM_ONE_MAX = 0: NORM_BD-column steps), and the counters are left at zero for the next
    launch."""
    from dsv4.kernels import mhc
    call, _, _ = _split_setup(op, t, d, True, monkeypatch)
    outs = []
    for one_max in (0, mhc.NORM_ONE_MAX):
        monkeypatch.setattr(mhc, "NORM_ONE_MAX", one_max)
        poison()
        outs.append(call("split"))
        assert _counters_zero()
    for a, b in zip(*outs):
        assert torch.equal(a, b), f"{op} t={t} d={d}: {int((a != b).sum())} of {a.numel()} outputs differ"


@pytest.mark.skipif(DEV == "cpu", reason="4 GB streams: on the GPU only")
def test_rows_past_two_to_the_31_elements(close_bf16):
    """One prefill of 2^17 + 2048 Flash-width tokens: the streams hold more than 2^31 elements, so 32-bit row offsets
    would wrap (session 69 found a 248K-token forward faulting in hc_pre). The last rows and the first, from hc_pre
    and hc_post_pre over all tokens, against the references run on those rows alone."""
    from dsv4.kernels.mhc import hc_post_pre, hc_post_pre_ref, hc_pre, hc_pre_ref, prepare_mix

    t, d = (1 << 17) + 2048, 4096
    if torch.cuda.mem_get_info()[0] < 24 << 30:
        pytest.skip("needs 24 GB of free GPU memory")
    gen = torch.Generator(DEV).manual_seed(69)
    x = _streams(t, d, gen)
    assert x.numel() > 1 << 31
    f = torch.randn(t, d, generator=gen, device=DEV).to(torch.bfloat16)
    fn, base, scale = _params(24, 3, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16)
    post0 = torch.rand(t, 4, generator=gen, device=DEV) * 2
    comb0 = torch.rand(t, 4, 4, generator=gen, device=DEV)
    u, post, comb = hc_pre(x, fn, base, scale, norm_weight=w, **KW)
    xn, u2, post2, comb2 = hc_post_pre(f, x, post0, comb0, prepare_mix(fn), base, scale, norm_weight=w, **KW)
    for rows in (slice(t - 1024, t), slice(0, 64)):
        ur, post_r, comb_r = hc_pre_ref(x[rows], fn, base, scale, norm_weight=w, **KW)
        close_bf16(u[rows], ur, rel=REL, what=f"hc_pre rows {rows}")
        assert _rel(post[rows], post_r) < 1e-4 and _rel(comb[rows], comb_r) < 1e-4
        xr, ur2, post_r2, comb_r2 = hc_post_pre_ref(f[rows], x[rows], post0[rows], comb0[rows], fn, base, scale,
                                                    norm_weight=w, **KW)
        close_bf16(xn[rows], xr, rel=REL, what=f"hc_post_pre streams rows {rows}")
        close_bf16(u2[rows], ur2, rel=REL, what=f"hc_post_pre input rows {rows}")
        assert _rel(post2[rows], post_r2) < 1e-4 and _rel(comb2[rows], comb_r2) < 1e-4
