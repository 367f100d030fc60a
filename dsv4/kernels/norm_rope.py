"""Attention input glue in one launch per tensor (kernel mode), beside the torch reference of the same
signature: RMS norm -> RoPE on the trailing pairs -> quantisation simulation, row by row.

    q latent   weighted RMSNorm (fp32 math)
    q heads    unweighted per-head norm in bf16 arithmetic (as the reference) + RoPE
    output     inverse RoPE of the attention output
    window kv  weighted RMSNorm + RoPE + FP8 simulation of the nope dims (blocks of 64)
    indexer q  RoPE + Hadamard rotation + FP4 simulation (blocks of 32)

The torch path spends 10-35 small launches on each of these (dsv4.model.norm/rope/numerics); the
reference below *is* that path, so the kernel is tested against what the model computes. fp32 sums
run in another order than torch's: results agree to bf16 rounding except at rare ties.
"""
from __future__ import annotations

import functools

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton  # noqa: F401
from dsv4.kernels._triton import pdl_kernel, pdl_wait, rotate_pairs
from dsv4.kernels.cache_store import pool_operands, store_rows

NONE, WEIGHTED, UNWEIGHTED = 0, 1, 2
SIM_NONE, SIM_FP8, SIM_FP4 = 0, 1, 2
# indexer q (SIM_FP4): rows per program, for one tensor-core dot with the Hadamard signs (one row per program
# loaded the whole matrix each: 2.58 ms for an 8K prompt's [8192, 64, 128] queries on the H200, s9e)
HADAMARD_ROWS = 64
# ... and its warps: at 64 rows on 4 warps the program holds 225 registers (two CTAs, 8 warps per SM); 128 rows on 8
# warps hold 223 and read the [128, 128] sign matrix once per 128 rows (offline, session 38; not yet measured:
# bench/runs/run_device_s39a.sh sweeps both knobs). 177 µs for an 8K prompt's [8192, 64, 128] (s37d), ≈ 2.8x the
# time of its 268 MB in and out at copy bandwidth.
HADAMARD_WARPS = 4
# other modes: rows per program from ROWS_FROM rows on (at most 4096 elements per tile); one row per program
# made 524,288 programs of 1 KB for an 8K prompt's queries [8192, 64, 512]: 408 µs, 2.6 TB/s (s12d)
ROWS_PER_PROGRAM, ROWS_FROM = 8, 2048
# cos / sin loaded with the rows, not after the norm's cross-warp reduction (offline SASS of the decode q / kv pair,
# `norm_rope_two`: the rows' loads, the reduction's barriers, then cos / sin from L2: two latencies in turn), in
# launches of one row per program (decode sizes, below ROWS_FROM rows; `_rope_first`). Session 43 (H200, µs per call
# in a graph, T = 1): q latent + kv 1.36 -> 1.17, query heads 1.27 -> 1.20; equal at T = 8. The same bits there; at
# 8 rows per program the compiled rotation's bits differed (s43c), so prefill keeps the old order. A switch for tests.
# Session 44: the difference was the compiler folding the other product of a pair into an fma, not the order itself;
# with the products rounded explicitly (_triton.rotate_pairs) the early loads keep the bits at 8 rows per program
# too (s45a), but they do not pay there (s46b, bench_glue --norm, µs in a graph, off / on): q latent + kv 3.95 / 4.20
# at 2,048 rows, 16.03 / 16.61 at 8,192 (the model's prefill pair); the query heads 68.0 / 66.4 and 264 / 258 (a
# launch the model's prefill leaves to the attention kernel). So one-row launches only.
ROPE_FIRST = True


def norm_rope_ref(x: torch.Tensor, *, norm: int = NONE, weight: torch.Tensor | None = None, eps: float = 0.0,
                  cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, sim: int = SIM_NONE,
                  nope: int = 0, inverse: bool = False) -> torch.Tensor:
    """x [T, D] or [T, G, D] bf16; cos/sin [T, rope/2] (per token, shared by the G rows; `inverse`
    rotates by -angle); nope: the FP8-simulated leading dims (sim=SIM_FP8). Returns the model's result,
    bf16 of x's shape."""
    from dsv4.model.norm import rms_norm, unweighted_rms_norm
    from dsv4.model.numerics import simulate_indexer_fp4, simulate_kv_fp8
    from dsv4.model.rope import apply_rope
    y = x
    if norm == WEIGHTED:
        y = rms_norm(y, weight, eps)
    elif norm == UNWEIGHTED:
        y = unweighted_rms_norm(y, eps)
    if cos is not None:
        c, s = (cos, sin) if x.dim() == 2 else (cos[:, None], sin[:, None])
        y = apply_rope(y, c, -s if inverse else s)
    if sim == SIM_FP8:
        y = simulate_kv_fp8(y, nope)
    elif sim == SIM_FP4:
        y = simulate_indexer_fp4(y)
    return y


if HAS_TRITON:
    from dsv4.kernels.cache_store import store_row
    from dsv4.kernels.fp8_linear import _e4m3, _pow2_scale

    @triton.jit
    def _bf16(v):
        return v.to(tl.bfloat16).to(tl.float32)

    @pdl_kernel
    @triton.jit
    def _norm_rope_kernel(X, OUT, W, COS, SIN, H, eps, hscale, G, rows, stride_cs,
                          D: tl.constexpr, DP: tl.constexpr, ROPE0: tl.constexpr, NOPE: tl.constexpr,
                          NORM: tl.constexpr, ROT: tl.constexpr, INV: tl.constexpr, SIM: tl.constexpr,
                          BR: tl.constexpr, INTERP: tl.constexpr, RF: tl.constexpr = False):
        """BR rows per program ([BR, DP] tiles, DP = D rounded up to a power of two, the padding zeros;
        BR > 1 for the Hadamard's tensor-core dot)."""
        wn, sgn = _norm_rope_static(W, H, D, DP, NORM, SIM)  # read before the PDL wait (beside the previous
        pdl_wait()                                            # kernel's tail)
        _norm_rope_rows(X, OUT, wn, sgn, COS, SIN, eps, hscale, G, rows, stride_cs, tl.program_id(0),
                        D, DP, ROPE0, NOPE, NORM, ROT, INV, SIM, BR, INTERP, RF)

    @pdl_kernel
    @triton.jit
    def _norm_rope_two_kernel(X, OUT, W, COS, SIN, H, eps, hscale, G, rows, stride_cs,
                              X2, OUT2, W2, COS2, SIN2, H2, eps2, hscale2, G2, rows2, stride_cs2, programs,
                              D: tl.constexpr, DP: tl.constexpr, ROPE0: tl.constexpr, NOPE: tl.constexpr,
                              NORM: tl.constexpr, ROT: tl.constexpr, INV: tl.constexpr, SIM: tl.constexpr,
                              BR: tl.constexpr,
                              D2: tl.constexpr, DP2: tl.constexpr, ROPE0_2: tl.constexpr, NOPE2: tl.constexpr,
                              NORM2: tl.constexpr, ROT2: tl.constexpr, INV2: tl.constexpr, SIM2: tl.constexpr,
                              BR2: tl.constexpr, INTERP: tl.constexpr, RF: tl.constexpr = False,
                              PAGE=None, OFF=None, SQ=None, SS=None, SR=None, q_page=0, q_off=0, s_page=0, s_off=0,
                              r_page=0, r_off=0, STORE2: tl.constexpr = False):
        """Two `norm_rope` calls in one launch (`norm_rope_two`): programs below `programs` run the first, the
        others the second, each row as `_norm_rope_kernel` computes it; every program reads its static operands,
        then waits for the previous kernel (PDL). STORE2 (one row per program): each second-part row also goes
        into its FP8 pool slot (PAGE, OFF) as `cache_store.store_rows` stores it. (Names differ per branch: Triton
        merges a name's types across the branches of a runtime `if`.)"""
        pid = tl.program_id(0)
        if pid < programs:
            wa, sa = _norm_rope_static(W, H, D, DP, NORM, SIM)
            pdl_wait()
            _norm_rope_rows(X, OUT, wa, sa, COS, SIN, eps, hscale, G, rows, stride_cs, pid,
                            D, DP, ROPE0, NOPE, NORM, ROT, INV, SIM, BR, INTERP, RF)
        else:
            wb, sb = _norm_rope_static(W2, H2, D2, DP2, NORM2, SIM2)
            pdl_wait()
            yb = _norm_rope_rows(X2, OUT2, wb, sb, COS2, SIN2, eps2, hscale2, G2, rows2, stride_cs2, pid - programs,
                                 D2, DP2, ROPE0_2, NOPE2, NORM2, ROT2, INV2, SIM2, BR2, INTERP, RF)
            if STORE2:
                store_row(tl.reshape(yb, (D2,)), pid - programs, PAGE, OFF, SQ, SS, SR, q_page, q_off, s_page, s_off,
                          r_page, r_off, D2, NOPE2, False)

    @triton.jit
    def unweighted_norm_rows(y, eps, D: tl.constexpr):
        """The q heads' unweighted RMS norm of rows y [R, DP] (fp32 of bf16 values, zero padding past D) in bf16
        arithmetic, every intermediate rounded as torch does (also the decode attention's q, `q_norm`)."""
        mean = _bf16(tl.sum(_bf16(y * y), axis=1) / D)
        r = _bf16(tl.math.rsqrt(_bf16(mean + eps)))
        return _bf16(y * r[:, None])

    @triton.jit
    def _norm_rope_static(W, H, D: tl.constexpr, DP: tl.constexpr, NORM: tl.constexpr, SIM: tl.constexpr):
        """The static operands of a call: the norm weight (NORM == 1) and the Hadamard signs (SIM == 2)."""
        d = tl.arange(0, DP)
        wn = 0.0
        sgn = 0.0
        if NORM == 1:
            wn = tl.load(W + d, mask=d < D, other=0.0).to(tl.float32)
        if SIM == 2:
            sgn = tl.load(H + d[:, None] * D + d[None, :])
        return wn, sgn

    @triton.jit
    def _norm_rope_rows(X, OUT, wn, sgn, COS, SIN, eps, hscale, G, rows, stride_cs, pid,
                        D: tl.constexpr, DP: tl.constexpr, ROPE0: tl.constexpr, NOPE: tl.constexpr,
                        NORM: tl.constexpr, ROT: tl.constexpr, INV: tl.constexpr, SIM: tl.constexpr,
                        BR: tl.constexpr, INTERP: tl.constexpr, RF: tl.constexpr):
        """Rows [pid BR, (pid + 1) BR) of one `norm_rope` call (wn, sgn: `_norm_rope_static`), stored and returned
        (fp32 [BR, DP] of the bf16 results). RF (`ROPE_FIRST`, one row per program): cos / sin loaded with the rows,
        before the norm's reduction (no load crosses its CTA barriers)."""
        d = tl.arange(0, DP)
        dm = d < D
        row = pid.to(tl.int64) * BR + tl.arange(0, BR)
        live = row < rows
        tok = row // G
        y = tl.load(X + row[:, None] * D + d[None, :], mask=live[:, None] & dm[None, :], other=0.0).to(tl.float32)
        if ROT:
            pair = tl.arange(0, DP // 2)
            rope = ((pair >= ROPE0 // 2) & (pair < D // 2))[None, :] & live[:, None]
            cs_off = tok[:, None] * stride_cs + (pair - ROPE0 // 2)[None, :]
            if RF:
                cs = tl.load(COS + cs_off, mask=rope, other=1.0)
                sn = tl.load(SIN + cs_off, mask=rope, other=0.0)
        if NORM == 1:
            ms = tl.sum(y * y, axis=1) / D
            y = _bf16(wn[None, :] * (y * tl.math.rsqrt(ms + eps)[:, None]))
        elif NORM == 2:
            y = unweighted_norm_rows(y, eps, D)
        if ROT:
            a, c = tl.split(tl.reshape(y, (BR, DP // 2, 2)))
            if not RF:
                cs = tl.load(COS + cs_off, mask=rope, other=1.0)
                sn = tl.load(SIN + cs_off, mask=rope, other=0.0)
            if INV:
                sn = -sn
            y = _bf16(tl.reshape(tl.join(*rotate_pairs(a, c, cs, sn)), (BR, DP)))
        if SIM == 1:  # FP8 simulation of the first NOPE dims, blocks of 64
            g = tl.reshape(y, (BR, DP // 64, 64))
            s, inv = _pow2_scale(tl.maximum(tl.max(tl.abs(g), axis=2), 1e-4))
            q = _e4m3(tl.clamp(g * inv[:, :, None], -448.0, 448.0)).to(tl.float32)
            y = tl.where(d[None, :] < NOPE, _bf16(tl.reshape(q * s[:, :, None], (BR, DP))), y)
        elif SIM == 2:  # Hadamard, then FP4 simulation in blocks of 32
            # y is bf16-exact and H = c * S with S = +-1: one tensor-core dot gives the sums of +-y exactly
            # per product (fp32 sums in the MMA's order), then the one multiply by c = hscale (the fp32 entry)
            if INTERP:  # the interpreter multiplies raw bf16 bits in `dot`
                hy = tl.dot(y, sgn.to(tl.float32))
            else:
                hy = tl.dot(y.to(tl.bfloat16), sgn)
            y = _bf16(hy * hscale)
            g = tl.reshape(y, (BR, D // 32, 32))
            v = tl.maximum(tl.max(tl.abs(g), axis=2), 6.0 * 1.1754943508222875e-38) * 0.16666667163372040
            bits = v.to(tl.int32, bitcast=True)
            e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
            s = (e << 23).to(tl.float32, bitcast=True)
            inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
            t = g * inv[:, :, None]
            a = tl.abs(t)
            mag = 0.5 * ((a > 0.25).to(tl.float32) + (a >= 0.75).to(tl.float32) + (a > 1.25).to(tl.float32)
                         + (a >= 1.75).to(tl.float32)) + (a > 2.5).to(tl.float32) + (a >= 3.5).to(tl.float32) \
                + 2.0 * (a > 5.0).to(tl.float32)
            y = _bf16(tl.reshape(tl.where(t < 0, -mag, mag) * s[:, :, None], (BR, D)))
        tl.store(OUT + row[:, None] * D + d[None, :], y.to(tl.bfloat16), mask=live[:, None] & dm[None, :])
        return y


def _plan(x: torch.Tensor, norm: int = NONE, weight: torch.Tensor | None = None, eps: float = 0.0,
          cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, sim: int = SIM_NONE, nope: int = 0,
          inverse: bool = False):
    """One `norm_rope` call's output, kernel arguments, constexprs, programs and warps."""
    d = x.shape[-1]
    need = {SIM_NONE: d % 2 == 0, SIM_FP8: d % 64 == 0, SIM_FP4: d >= 32 and not d & (d - 1)}[sim]
    if x.dtype != torch.bfloat16 or not need:
        raise ValueError(f"norm_rope: x must be bf16 with a last dim that is even (a multiple of 64 with sim=SIM_FP8, "
                         f"a power of two >= 32 with sim=SIM_FP4), got {x.dtype} {tuple(x.shape)}, sim={sim}")
    g = x.shape[1] if x.dim() == 3 else 1
    x = x.contiguous()
    out = torch.empty_like(x)
    rows = x.numel() // d
    rot = cos is not None
    cos_t = cos.float().contiguous() if rot else x
    sin_t = sin.float().contiguous() if rot else x
    had, br = x, 1
    if rows >= ROWS_FROM:
        br = max(1, min(ROWS_PER_PROGRAM, 4096 // triton.next_power_of_2(d)))
    if sim == SIM_FP4:
        had, br = _hadamard_signs(d, x.device), HADAMARD_ROWS
    hscale = _hadamard_scale(d)
    args = (x, out, weight if weight is not None else x, cos_t, sin_t, had, float(eps), hscale, g, rows,
            cos_t.stride(0) if rot else 0)
    consts = dict(D=d, DP=triton.next_power_of_2(d), ROPE0=d - 2 * cos_t.shape[-1] if rot else d, NOPE=nope,
                  NORM=norm, ROT=rot, INV=inverse, SIM=sim, BR=br)
    warps = HADAMARD_WARPS if sim == SIM_FP4 else 4 if d <= 512 else 8
    return out, args, consts, triton.cdiv(rows, br), warps


def _rope_first(consts: dict) -> bool:
    """ROPE_FIRST for a launch of these constexprs: one row per program, or the Hadamard's (whose SASS it leaves
    unchanged); at 8 rows per program the early loads were slower (session 46)."""
    return ROPE_FIRST and (consts["BR"] == 1 or consts["SIM"] == SIM_FP4)


def norm_rope(x: torch.Tensor, *, norm: int = NONE, weight: torch.Tensor | None = None, eps: float = 0.0,
              cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, sim: int = SIM_NONE,
              nope: int = 0, inverse: bool = False) -> torch.Tensor:
    """Triton `norm_rope_ref` (bf16; D even, a multiple of 64 with the FP8 simulation, a power of two >= 32
    with the Hadamard one; Pro's q latent is 1536 wide)."""
    out, args, consts, programs, warps = _plan(x, norm, weight, eps, cos, sin, sim, nope, inverse)
    if programs:
        _norm_rope_kernel[(programs,)](*args, **consts, INTERP=INTERPRET, RF=_rope_first(consts), num_warps=warps)
    return out


_SECOND = {"D": "D2", "DP": "DP2", "ROPE0": "ROPE0_2", "NOPE": "NOPE2", "NORM": "NORM2", "ROT": "ROT2",
           "INV": "INV2", "SIM": "SIM2", "BR": "BR2"}


def norm_rope_two_ref(a: torch.Tensor, a_kw: dict, b: torch.Tensor, b_kw: dict,
                      store_b: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract of `norm_rope_two`: the two `norm_rope_ref` calls, b's result stored by `store_rows_ref`."""
    from dsv4.kernels.cache_store import store_rows_ref
    out_a, out_b = norm_rope_ref(a, **a_kw), norm_rope_ref(b, **b_kw)
    if store_b is not None:
        store_rows_ref(out_b, *store_b)
    return out_a, out_b


def norm_rope_two(a: torch.Tensor, a_kw: dict, b: torch.Tensor, b_kw: dict,
                  store_b: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`norm_rope(a, **a_kw)` and `norm_rope(b, **b_kw)` in one launch (two tensors of a layer that come from one
    GEMM: one launch fewer per layer at decode). Each program runs `_norm_rope_kernel`'s rows of one of them, so
    the results are the two calls' bits where both use the same warps (4 up to 512 columns, else 8); otherwise up
    to the fp32 order of a row's sum of squares (rare last-bit flips). `store_b` = (page, off, pool): b's results
    also stored into that FP8 pool as `cache_store.store_rows(b's results, page, off, pool)` stores them (the
    paged decode step's window kv: one launch fewer per layer); in the same launch for one row per program, else
    by that call."""
    out_a, args_a, consts_a, pa, wa = _plan(a, **a_kw)
    out_b, args_b, consts_b, pb, wb = _plan(b, **b_kw)
    store = {}  # the kernel's store arguments, where it stores b's rows itself
    if store_b is not None:
        page, off, pool = store_b
        sq, ss, sr, strides, _ = pool_operands(pool, b.shape[-1], "norm_rope_two")  # (checks the pool)
        if _stores_in_kernel(b, consts_b, pool):
            store = dict(PAGE=page, OFF=off, SQ=sq, SS=ss, SR=sr, q_page=strides[0], q_off=strides[1],
                         s_page=strides[2], s_off=strides[3], r_page=strides[4], r_off=strides[5], STORE2=True)
    if pa + pb:  # (an empty part has no programs)
        _norm_rope_two_kernel[(pa + pb,)](*args_a, *args_b, pa, **consts_a,
                                          **{_SECOND[k]: v for k, v in consts_b.items()}, INTERP=INTERPRET,
                                          RF=_rope_first(consts_a) and _rope_first(consts_b),
                                          num_warps=max(wa, wb), **store)
    if store_b is not None and not store:
        store_rows(out_b, *store_b)
    return out_a, out_b


def _stores_in_kernel(b: torch.Tensor, consts: dict, pool) -> bool:
    """Whether `norm_rope_two` stores b's rows in its own launch: one FP8-simulated [T, D] row per program (decode
    sizes), D a power of two and the pool FP8 with b's nope dims."""
    return (b.dim() == 2 and consts["BR"] == 1 and consts["DP"] == consts["D"] and consts["SIM"] == SIM_FP8
            and pool.fp8 and pool.nope == consts["NOPE"])


@functools.cache
def _hadamard_scale(d: int) -> float:
    """The Hadamard matrix's fp32 entry magnitude d^-1/2 (once per width: a host tensor per call cost ~10 µs)."""
    return float(torch.tensor(d ** -0.5, dtype=torch.float64).float())


@functools.lru_cache(maxsize=None)
def _hadamard_signs(n: int, device: torch.device) -> torch.Tensor:
    """The +-1 signs of the normalised Hadamard matrix (exact in bf16), once per device."""
    from dsv4.model.numerics import hadamard_matrix
    return torch.sign(hadamard_matrix(n, torch.float32, device)).to(torch.bfloat16)
