"""mHC kernels (spec §2.2, §2.10): pre (RMS-scaled mix + Sinkhorn + collapse), post (expand + mix),
post(prev) fused with pre(next), and the HC head — each beside a torch reference of the same signature.

Two launches per mHC site:

* `_mix_kernel` (grid: token blocks x D splits) reads the streams X [T, 4, D] once — for the fused
  variant it first forms `X'_k = post_k f + sum_j comb[j, k] X_j`, rounds it to bf16 and stores it —
  and writes split partials of the 24 mixes `fn . flat(X)` and of `sum(X^2)`. The mix runs on the
  tensor cores: X is exactly bf16 and the fp32 `fn` is split into `hi + lo` bf16 halves, so two bf16
  dots with fp32 accumulation reproduce the fp32 product to ~2^-17 relative.
* the finish sums the partials, applies rho and the sigmoids; one program per token runs the
  20-iteration Sinkhorn in the spec's order (row softmax + eps, column step, 19 x (row, column)) and
  writes post/comb, beside the collapse `u = sum_j pre_j X_j` (fp32 -> bf16), optionally followed by
  the sub-layer's weighted RMSNorm (the only consumer of u). Two variants (`collapse=`; default COLLAPSE):
  "row" (`_finish_kernel`): one program per token collapses its whole row (in one chunk up to
  ROW_ONE_PASS_MAX columns, else in 1024-column chunks, twice with a norm) -- at T = 1 that took hc_pre
  12.2 -> 10.1 µs on the H200. "split" (`_finish_split_kernel`): one program per
  SPLIT_BD columns; with a norm each stores its chunk's sum of squares and counts its arrival, and the
  token's last program sums the partials (by chunk index: deterministic), re-reads u and writes the
  normed row. Same pre and u bits as "row"; the normed row differs only by the fp32 order of the sum of
  squares (rare 1-ulp flips). A "block" finish ("split" over 8 tokens per program, a thread-local Sinkhorn per
  token) saved only 4 % of the finish kernels at 8K tokens and moved u by more than an ulp; removed in session 31
  (docs/benchmarks.md). A one-launch "fused" finish (the mix's last-arriving program ran it) measured
  slower and was removed (docs/benchmarks.md). So were prefill sites run chunk by chunk (a mix and a finish per
  1024 or 2048 tokens, so the finish re-reads X' from L2): 0.64-0.93x the one launch pair at 8K tokens, whose sites
  already move their bytes at ≈ 80 % of the copy bandwidth (session 77).
  The HC head uses the same kernels with 4 mixes, `w = sigmoid(m scale + base) + eps`, no Sinkhorn.

The Triton code is in dsv4.kernels.mhc_kernels.

`hc` must be 4 (all released models); the kernels name the four streams explicitly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dsv4.model.hyper import hc_head as _hc_head_model
from dsv4.model.hyper import hc_post as _hc_post_model
from dsv4.model.hyper import hc_pre as _hc_pre_model

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, triton, weight_prefetch_kblocks
from dsv4.kernels.moe_combine import PendingCombine, materialized

if HAS_TRITON:
    from dsv4.kernels.mhc_kernels import _finish_kernel, _finish_split_kernel, _mix_kernel, _mix_rows_kernel

HC = 4
MIX_PAD = 32  # 24 mixes (pre) or 4 (head), padded to one dot tile
# finish variant when a call does not pick one: "row" or "split" (module docstring). "split" measured faster
# in session 7 (T = 1, µs in a graph): hc_pre 10.4 -> 9.8, hc_post_pre 12.1 -> 11.3, hc_head 9.9 -> 8.0.
COLLAPSE = "split"
# ... above 16 tokens (prefill). s30e (8K tokens, 4 layers, finish kernels): split 2,043 µs vs 2,291 for a "row"
# finish that walked the row in 1024-column chunks, twice with a norm; "row" now takes a row of up to
# ROW_ONE_PASS_MAX columns in one chunk (one pass, every load of the row issued at once): s36b, 8K tokens, Flash
# width, µs per site (mix + finish) split -> row: hc_pre 255.5 -> 236.8, hc_post_pre 404.1 -> 389.7
COLLAPSE_PREFILL = "row"
ROW_ONE_PASS_MAX = 8192
SPLIT_BD = 512  # columns per collapse program of the split finish
# token rows per mix program above 16 tokens with the post fused in: it holds X, f and X' tiles at once
# (at 64 rows the fused mix took 735 µs at 8K tokens vs 104 µs without the post, s12d)
FUSED_BT = 32
# prefill (above 16 tokens) launch shape of the mix: rows without the post fused in, columns per step, warps
# and software-pipeline stages (`bench/sweep_mhc_mix.py`; decode sizes keep 16 x 64 on 4 warps)
MIX_BT = 64
MIX_BK = 64
MIX_WARPS = 4
MIX_STAGES = 2
# prefill mixes as the transposed product (`_mix_dot`'s TRANS): hi and lo fn rows stacked into one 64-row
# wgmma tile, the stream tile stored to shared memory once. H200, 8K tokens, µs per call (s14a/s14b,
# `bench/sweep_mhc_mix.py`): hc_post_pre 624 -> 403 (32 x 64 on 2 stages; ptxas at 32 x 32: 128 registers, no
# spills, where the untransposed mix took 255 + spills), hc_pre 261 -> 252
MIX_TRANS = True
# Up to this many tokens the mHC sites with the post fused in, and the HC head, mix on CUDA cores
# (`_mix_rows_kernel`, ROWS_BK columns of each stream per program) instead of a 16-row dot tile with one live row.
# Session 19 (H200, T = 1, µs per site in a graph, dot -> rows): hc_post_pre 10.76 -> 9.26, hc_head 7.50 -> 5.45;
# a plain hc_pre 9.19 -> 10.88 and T = 4 (13.3 vs 11.6 for hc_post_pre) were slower, so they keep the dot.
ROWS_MAX_T = 1
ROWS_BK = 64
# ... with one step per program (one token, ROWS_BK columns; Flash's 4096 columns, not Pro's 7168 = 16 x 448): fn's
# tiles into registers before the PDL wait, not from L2 after X' is stored (the same values, bit-identical). Session 43
# (H200, T = 1, µs per site in a graph, in-loop -> early): hc_post_pre 9.0 -> 6.4, hc_head 4.9 -> 4.2 (254 registers,
# 64 programs). Kept as a switch for the bit-identity test of the two paths.
ROWS_FN_EARLY = True
# warps of the finish launch. At 4 warps the 20 Sinkhorn iterations on a [4, 4] tile reduce across warps (79
# barriers, bench/sass_stats.py mhc_finish), yet neither 1 or 2 warps (s20b) nor a Sinkhorn on per-thread scalars
# (s20d) nor the RMSNorm in every collapse program instead of the last arriver (s20f) made a site faster.
FINISH_WARPS = 4
NORM_BD = 2048  # columns per step of the split finish's RMSNorm pass (the token's last-arriving program)
# ... or the whole row in one step up to NORM_ONE_MAX columns (Flash and Pro), its u and norm-weight loads issued
# before the partial sums of squares (the stepped pass issued the partials' load, their sum, then each step's loads:
# three L2 latencies in turn). Session 43 (H200, µs per site in a graph, stepped -> one step): hc_head T = 8 6.95 ->
# 6.37, T = 1 4.9 -> 4.4; 45 -> 48 registers.
NORM_ONE_MAX = 8192


class MixWeight(NamedTuple):
    """fn [n_mix, 4D] fp32 split for the tensor cores: hi = bf16(fn), lo = bf16(fn - hi), both [32, 4D]."""

    hi: torch.Tensor
    lo: torch.Tensor
    n_mix: int


def prepare_mix(fn: torch.Tensor) -> MixWeight:
    """Split an fp32 mHC/HC-head `fn` into bf16 hi/lo halves padded to 32 rows (do once per weight)."""
    if fn.dim() != 2 or fn.shape[0] > MIX_PAD:
        raise ValueError(f"mHC fn: expected [n_mix <= {MIX_PAD}, hc*D], got {tuple(fn.shape)}")
    f32 = fn.to(torch.float32)
    hi = torch.zeros(MIX_PAD, fn.shape[1], dtype=torch.bfloat16, device=fn.device)
    lo = torch.zeros_like(hi)
    hi[: fn.shape[0]] = f32.to(torch.bfloat16)
    lo[: fn.shape[0]] = (f32 - hi[: fn.shape[0]].float()).to(torch.bfloat16)
    return MixWeight(hi, lo, fn.shape[0])


# --------------------------------------------------------------------------- torch references


def _rms_norm_ref(u: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    uf = u.float()
    return (weight.float() * uf * torch.rsqrt(uf.square().mean(-1, keepdim=True) + eps)).to(u.dtype)


def hc_pre_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
               sinkhorn_iters: int, hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, 4, D] bf16 -> (u [T, D] bf16 — RMSNorm_w(u) when norm_weight is given —, post [T, 4],
    comb [T, 4, 4])."""
    u, post, comb = _hc_pre_model(x, fn, base, scale, sinkhorn_iters=sinkhorn_iters, hc_eps=hc_eps,
                                  norm_eps=norm_eps)
    if norm_weight is not None:
        u = _rms_norm_ref(u, norm_weight, norm_eps)
    return u, post, comb


def hc_post_ref(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_k = post_k f + sum_j comb[j, k] X_j (fp32, rounded to bf16): [T, 4, D]."""
    return _hc_post_model(f, x, post, comb)


def hc_post_pre_ref(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                    fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *, sinkhorn_iters: int,
                    hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None):
    """post of one sub-layer followed by pre of the next: (X', u, post', comb')."""
    x_new = hc_post_ref(f, x, post, comb)
    return (x_new,) + hc_pre_ref(x_new, fn, base, scale, sinkhorn_iters=sinkhorn_iters, hc_eps=hc_eps,
                                 norm_eps=norm_eps, norm_weight=norm_weight)


def hc_head_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
                hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None) -> torch.Tensor:
    """HC head collapse y [T, D] bf16 (then RMSNorm_w(y) when norm_weight is given)."""
    y = _hc_head_model(x, fn, base, scale, hc_eps=hc_eps, norm_eps=norm_eps)
    return _rms_norm_ref(y, norm_weight, norm_eps) if norm_weight is not None else y


# --------------------------------------------------------------------------- launchers


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.mhc: triton is not installed (use the *_ref functions)")


def _check_streams(x: torch.Tensor, name: str = "x") -> tuple[int, int]:
    if x.dim() != 3 or x.shape[1] != HC or x.dtype != torch.bfloat16:
        raise ValueError(f"mHC {name}: expected bf16 [T, {HC}, D], got {x.dtype} {tuple(x.shape)}")
    if x.shape[2] % 16:
        raise ValueError(f"mHC {name}: hidden size {x.shape[2]} must be a multiple of 16")
    return x.shape[0], x.shape[2]


def _pick_split(t: int, d: int, bt: int, bk: int) -> tuple[int, int]:
    """(splits, D columns per split): enough programs to fill the chip at decode sizes."""
    chunks = triton.cdiv(d, bk)
    tblocks = triton.cdiv(t, bt)
    split = 1
    while split * 2 <= chunks and tblocks * split < 264 and chunks % (split * 2) == 0:
        split *= 2
    return split, (chunks // split) * bk


def _as_mix(fn) -> MixWeight:
    return fn if isinstance(fn, MixWeight) else prepare_mix(fn)


class _Finish(NamedTuple):
    """What a site's finish needs besides the mix: HC-head or pre, the norm, Sinkhorn and eps, variant."""

    base: torch.Tensor
    scale: torch.Tensor
    norm_weight: torch.Tensor | None
    head: bool
    iters: int
    hc_eps: float
    norm_eps: float
    mode: str  # "row" or "split"


def _finish_outputs(x: torch.Tensor, fin: _Finish):
    t, d = x.shape[0], x.shape[2]
    u = torch.empty(t, d, dtype=torch.bfloat16, device=x.device)
    normed = torch.empty_like(u) if fin.norm_weight is not None else u
    post = torch.empty(t, HC, dtype=torch.float32, device=x.device)
    comb = torch.empty(t, HC, HC, dtype=torch.float32, device=x.device)
    args = (fin.base.float().contiguous(), fin.scale.float().contiguous(),
            fin.norm_weight if fin.norm_weight is not None else u, u, normed, post, comb)
    return args, ((normed if fin.norm_weight is not None else u), post, comb)


def _site(x: torch.Tensor, fn: MixWeight, fuse: tuple | None, fin: _Finish | None):
    """One mHC site: the mix (the post fused in when `fuse` = (f, post, comb)), then the finish `fin` (None:
    post only). -> (X' or x, the finish's outputs or None)."""
    t, d = x.shape[0], x.shape[2]
    # decode sizes on CUDA cores where measured faster: the post fused into a pre, and the HC head (ROWS_MAX_T)
    rows = t <= ROWS_MAX_T and fin is not None and (fuse is not None or fin.head)
    prefill = t > 16
    bt = (FUSED_BT if fuse is not None else MIX_BT) if prefill else 16
    bk = min(ROWS_BK if rows else MIX_BK if prefill else 64, triton.next_power_of_2(d))
    split, per = _pick_split(t, d, 1 if rows else bt, bk)
    part = torch.empty(split, t, MIX_PAD, dtype=torch.float32, device=x.device)
    sq = torch.empty(split, t, dtype=torch.float32, device=x.device)
    combine = {}
    if fuse is not None:
        f, post, comb = fuse
        xout = torch.empty_like(x)
        # the MoE's combine summed here, as the mix loads f: decode tiles only (the prefill tiles' X' moved by one
        # bf16 ulp at 2 of 327680 values on the H200, s51: another FMA contraction; the block never defers there)
        if isinstance(f, PendingCombine) and f.out.dtype == torch.bfloat16 and not prefill:
            combine, f = f.kernel_args(), x
        f = materialized(f).to(torch.bfloat16).contiguous()
        post, comb = post.contiguous().float(), comb.contiguous().float()
    else:
        f = post = comb = xout = x
    if rows:
        _mix_rows_kernel[(split,)](
            x, f, post, comb, xout, fn.hi, fn.lo, part, sq, t, d, per, HC * d,
            FUSE_POST=fuse is not None, NM=max(2, triton.next_power_of_2(fn.n_mix)), NP=MIX_PAD,
            BK=bk, PREFETCH=weight_prefetch_kblocks(2 * fn.hi.numel() * fn.hi.element_size()) > 0 and per % 8 == 0
            and d % 8 == 0, FN_EARLY=ROWS_FN_EARLY and t == 1 and per == bk, num_warps=4, **combine)
    else:
        _mix_kernel[(triton.cdiv(t, bt), split)](
            x, f, post, comb, xout, fn.hi, fn.lo, part, sq, t, d, per,
            FUSE_POST=fuse is not None, DO_MIX=fin is not None, NP=MIX_PAD, BT=bt, BK=bk, INTERP=INTERPRET,
            TRANS=MIX_TRANS and prefill,
            # prefill: comb's 16 per-token columns loaded once, before the column loop, not in every step (s38e, 8K
            # fused site 382 -> 368 µs; 234 -> 228 registers, 58 -> 26 cp.async per step); 16-row tiles spill with it
            COMB_ONCE=prefill,
            num_warps=MIX_WARPS if prefill else 4, num_stages=MIX_STAGES if prefill else 3, **combine,
        )
    if fin is None:
        return xout, None
    return xout, _finish(xout, part, sq, split, fin)


def _token_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Per-token arrival counters of the split finish with a norm (dsv4.kernels._triton)."""
    return arrival_counters("mHC split finish", device, needed)


def _collapse_mode(collapse: str | None, who: str, t: int) -> str:
    mode = collapse if collapse is not None else COLLAPSE_PREFILL if t > 16 else COLLAPSE
    if mode not in ("row", "split"):
        raise ValueError(f"{who}: collapse={mode!r} must be 'row' or 'split'")
    return mode


def _finish(x, part, sq, split, fin: _Finish):
    t, d = x.shape[0], x.shape[2]
    args, outs = _finish_outputs(x, fin)
    u = args[3]
    args = (x, part, sq) + args
    tail = (t, d, split, float(fin.hc_eps), float(fin.norm_eps))
    kw = dict(HAS_NORM=fin.norm_weight is not None, ITERS=fin.iters, NP=MIX_PAD,
              SP=max(2, triton.next_power_of_2(split)), num_warps=FINISH_WARPS)
    if fin.mode == "row":
        bd = triton.next_power_of_2(d)
        one = bd <= ROW_ONE_PASS_MAX
        bd = bd if one else 1024
        # (FINISH_WARPS also for one pass: 4096 columns take 80 registers, 8192 168, no spills, sass_stats.py
        # mhc_finish_row; the Sinkhorn programs of the launch must keep split's warps, else comb's bits differ)
        _finish_kernel[(t, 1 if fin.head else 2)](*args, *tail, BD=bd, ONE_PASS=one, **kw)
    else:  # "split": one arrival counter per token
        bd = min(SPLIT_BD, triton.next_power_of_2(d))
        nb = triton.cdiv(d, bd)
        nbp = max(2, triton.next_power_of_2(nb))
        usq = cnt = u  # the norm's per-token partial sums of squares (each written before read) and counters
        if fin.norm_weight is not None:
            usq, cnt = torch.empty(t, nbp, dtype=torch.float32, device=x.device), _token_counters(x.device, t)
        lead, dp = 0 if fin.head else 1, triton.next_power_of_2(d)
        one = dp <= NORM_ONE_MAX
        nbd = dp if one else min(NORM_BD, dp)
        _finish_split_kernel[(t, nb + lead)](*args, usq, cnt, *tail, LEAD=lead, BD=bd, NBP=nbp, NBD=nbd, NORM_ONE=one,
                                             **kw)
    return outs


def hc_pre(x: torch.Tensor, fn, base: torch.Tensor, scale: torch.Tensor, *, sinkhorn_iters: int,
           hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None, collapse: str | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton mHC pre (contract of `hc_pre_ref`); `fn` is the fp32 weight or a `prepare_mix` result;
    `collapse` picks the finish variant ("row" / "split"; default: COLLAPSE, above 16 tokens
    COLLAPSE_PREFILL)."""
    _require_triton()
    _check_streams(x)
    mode = _collapse_mode(collapse, "hc_pre", x.shape[0])
    if sinkhorn_iters < 1:
        raise ValueError(f"hc_pre: sinkhorn_iters={sinkhorn_iters} must be >= 1")
    fn = _as_mix(fn)
    if fn.n_mix != (2 + HC) * HC:
        raise ValueError(f"hc_pre: fn has {fn.n_mix} mixes, expected {(2 + HC) * HC}")
    fin = _Finish(base, scale, norm_weight, False, sinkhorn_iters, hc_eps, norm_eps, mode)
    return _site(x.contiguous(), fn, None, fin)[1]


def hc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Triton mHC post (contract of `hc_post_ref`): one launch."""
    _require_triton()
    t, d = _check_streams(x)
    if f.shape != (t, d):
        raise ValueError(f"hc_post: f {tuple(f.shape)} does not match x {tuple(x.shape)}")
    dummy = MixWeight(x, x, 0)
    return _site(x.contiguous(), dummy, (materialized(f), post, comb), None)[0]  # (`finish_carry`: launched)


def hc_post_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn, base: torch.Tensor,
                scale: torch.Tensor, *, sinkhorn_iters: int, hc_eps: float, norm_eps: float,
                norm_weight: torch.Tensor | None = None, collapse: str | None = None):
    """Triton post(prev sub-layer) + pre(next) in two launches (contract of `hc_post_pre_ref`)."""
    _require_triton()
    t, d = _check_streams(x)
    mode = _collapse_mode(collapse, "hc_post_pre", t)
    if f.shape != (t, d):
        raise ValueError(f"hc_post_pre: f {tuple(f.shape)} does not match x {tuple(x.shape)}")
    fin = _Finish(base, scale, norm_weight, False, sinkhorn_iters, hc_eps, norm_eps, mode)
    xout, outs = _site(x.contiguous(), _as_mix(fn), (f, post, comb), fin)  # (f: also a deferred MoE combine)
    return (xout,) + outs


def hc_head(x: torch.Tensor, fn, base: torch.Tensor, scale: torch.Tensor, *, hc_eps: float, norm_eps: float,
            norm_weight: torch.Tensor | None = None, collapse: str | None = None) -> torch.Tensor:
    """Triton HC head (contract of `hc_head_ref`), two launches, final RMSNorm fused when given."""
    _require_triton()
    _check_streams(x)
    mode = _collapse_mode(collapse, "hc_head", x.shape[0])
    fn = _as_mix(fn)
    if fn.n_mix != HC:
        raise ValueError(f"hc_head: fn has {fn.n_mix} mixes, expected {HC}")
    fin = _Finish(base, scale, norm_weight, True, 1, hc_eps, norm_eps, mode)
    return _site(x.contiguous(), fn, None, fin)[1][0]
