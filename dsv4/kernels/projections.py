"""A layer's fused bf16 projections of the attention input (kernel mode): the epilogue launch after the
GEMM, a one-launch GEMV + epilogue for decode sizes (the default there), and the torch reference.

Kernel mode runs every bf16 linear that reads the attention input `a` -- the compressors' wkv and
wgate, the indexer's weights_proj -- as one GEMM into fp32 over their row-stacked weights
(`Attention.fused_input_weight`). The epilogue finishes that output `y` [T, N] the way the separate
modules do:

    gate columns     y[:, col:col+w] += ape[pos mod r]     (in place, fp32: `Compressor.project`)
    head weights     bf16(bf16(y[:, col:col+n]) * scale)   (a new tensor: `weights_proj(a) * weight_scale`)

Both are elementwise on the same fp32 values as the torch path, so results are bit-identical given the
same `y`. (Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding: 1 ulp off there.)

`finish_projections(y, ...)` is that epilogue as one launch after cuBLAS (`bf16_gemm_fp32`).
`project_decode(a, weight, ...)` -> (y, head weights) is the GEMM and the epilogue in one launch for
T <= DECODE_MAX_T rows (`DECODE_GEMV`, on by default). Programs split W over row tiles and K slices and
store fp32 partials (bf16 products are exact in fp32; each slice is summed by the tensor-core dot in its
own order); per row tile, the last program to arrive (an arrival counter it resets for the next launch
and for CUDA-graph replays) adds the slices in slice order -- the same bits whoever arrives last --
and runs the same epilogue (`_finish_block`) on its columns. y is cuBLAS's up to fp32 summation
order, so a head weight can flip by 1 bf16 ulp where the two sums straddle a rounding boundary.
"""
from __future__ import annotations

from typing import Sequence

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton  # noqa: F401
from dsv4.kernels._triton import pdl_kernel, pdl_wait, prefetch_l2, weight_prefetch_kblocks

Gate = tuple[int, torch.Tensor]              # (first column, ape fp32 [ratio, width])
HeadWeights = tuple[int, int, float]         # (first column, number of heads, scale)
COL_BLOCK = 256
# Attention._project_fused: project_decode instead of cuBLAS + finish_projections. Default since session 8:
# Flash CSA (N 2624) 11.0 -> 7.5 µs, HCA (N 1024) 7.6 -> 5.0 µs per call in a CUDA graph at T = 1..16.
DECODE_GEMV = True
DECODE_MAX_T = 16     # rows one project_decode launch handles (the dot's M tile)


def finish_projections_ref(y: torch.Tensor, positions: torch.Tensor, gates: Sequence[Gate],
                           head_weights: HeadWeights | None = None) -> torch.Tensor | None:
    """y fp32 [T, N] (updated in place), positions int [T] (>= 0). Adds ape[positions mod ratio] to
    each gate's columns; returns the bf16 head weights [T, n] (None without `head_weights`)."""
    for col, ape in gates:
        y[:, col:col + ape.shape[1]] += ape[positions % ape.shape[0]]
    if head_weights is None:
        return None
    col, n, scale = head_weights
    return y[:, col:col + n].to(torch.bfloat16) * scale


if HAS_TRITON:

    @triton.jit
    def _finish_block(z, t, cols, ok, pos, APE0, APE1, W_OUT, scale,
                      COL0: tl.constexpr, WIDTH0: tl.constexpr, R0: tl.constexpr,
                      COL1: tl.constexpr, WIDTH1: tl.constexpr, R1: tl.constexpr,
                      COLW: tl.constexpr, NW: tl.constexpr):
        """The epilogue of fp32 values z of y at rows t and columns cols (broadcastable; `ok` masks
        padding, pos = the rows' positions): returns z with each gate's ape row added on its columns;
        stores the rounded head weights of the head columns into W_OUT [T, NW]."""
        if WIDTH0 > 0:
            m = ok & (cols >= COL0) & (cols < COL0 + WIDTH0)
            ape = tl.load(APE0 + (pos % R0) * WIDTH0 + (cols - COL0), mask=m, other=0.0)
            z = tl.where(m, z + ape, z)  # where, not + 0: -0.0 outside the gates stays -0.0
        if WIDTH1 > 0:
            m = ok & (cols >= COL1) & (cols < COL1 + WIDTH1)
            ape = tl.load(APE1 + (pos % R1) * WIDTH1 + (cols - COL1), mask=m, other=0.0)
            z = tl.where(m, z + ape, z)
        if NW > 0:
            m = ok & (cols >= COLW) & (cols < COLW + NW)
            w = z.to(tl.bfloat16).to(tl.float32) * scale  # torch: bf16 * float in fp32
            tl.store(W_OUT + t * NW + (cols - COLW), w.to(tl.bfloat16), mask=m)
        return z

    @triton.jit
    def _finish_span(row, t, pos, APE0, APE1, W_OUT, scale, COL: tl.constexpr, WIDTH: tl.constexpr,
                     STORE: tl.constexpr, COL0: tl.constexpr, WIDTH0: tl.constexpr, R0: tl.constexpr,
                     COL1: tl.constexpr, WIDTH1: tl.constexpr, R1: tl.constexpr,
                     COLW: tl.constexpr, NW: tl.constexpr, BLOCK: tl.constexpr):
        for c0 in tl.static_range(0, WIDTH, BLOCK):
            cols = COL + c0 + tl.arange(0, BLOCK)
            m = cols < COL + WIDTH
            z = _finish_block(tl.load(row + cols, mask=m), t, cols, m, pos, APE0, APE1, W_OUT, scale,
                              COL0, WIDTH0, R0, COL1, WIDTH1, R1, COLW, NW)
            if STORE:
                tl.store(row + cols, z, mask=m)

    @pdl_kernel
    @triton.jit
    def _finish_kernel(Y, POS, APE0, APE1, W_OUT, stride_y, scale,
                       COL0: tl.constexpr, WIDTH0: tl.constexpr, R0: tl.constexpr,
                       COL1: tl.constexpr, WIDTH1: tl.constexpr, R1: tl.constexpr,
                       COLW: tl.constexpr, NW: tl.constexpr, BLOCK: tl.constexpr):
        """One row of y per program: its gate spans (updated in place), then its head span (read only)."""
        pdl_wait()
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(POS + t).to(tl.int64)
        row = Y + t * stride_y
        _finish_span(row, t, pos, APE0, APE1, W_OUT, scale, COL0, WIDTH0, True,
                     COL0, WIDTH0, R0, COL1, WIDTH1, R1, COLW, NW, BLOCK)
        _finish_span(row, t, pos, APE0, APE1, W_OUT, scale, COL1, WIDTH1, True,
                     COL0, WIDTH0, R0, COL1, WIDTH1, R1, COLW, NW, BLOCK)
        _finish_span(row, t, pos, APE0, APE1, W_OUT, scale, COLW, NW, False,
                     COL0, WIDTH0, R0, COL1, WIDTH1, R1, COLW, NW, BLOCK)

    @pdl_kernel
    @triton.jit
    def _decode_kernel(A, W, PART, Y, CNT, POS, APE0, APE1, W_OUT, T, N, stride_a, stride_w, scale,
                       K: tl.constexpr, BN: tl.constexpr, KS: tl.constexpr, BK: tl.constexpr,
                       S: tl.constexpr, TM: tl.constexpr, INTERP: tl.constexpr,
                       COL0: tl.constexpr, WIDTH0: tl.constexpr, R0: tl.constexpr,
                       COL1: tl.constexpr, WIDTH1: tl.constexpr, R1: tl.constexpr,
                       COLW: tl.constexpr, NW: tl.constexpr, PREFETCH: tl.constexpr):
        """Program i: W rows [BN * (i // S), +BN) x K slice [KS * (i % S), +KS) for all T rows of A
        (padded to the dot's TM); partials -> PART [S, T, N]. The tile's last arriver sums its S
        partials in slice order, runs the epilogue and stores y [T, N]. PREFETCH: the rows' slices are
        16-byte aligned, started into L2 before the PDL wait."""
        pid = tl.program_id(0)
        tile, split = pid // S, pid % S  # neighbouring programs: one row tile, consecutive K slices
        rt = tl.arange(0, TM)
        rn = tile * BN + tl.arange(0, BN)
        if PREFETCH:  # the (static) weights only, before the wait
            prefetch_l2(W + split * KS, tl.minimum(rn, N - 1).to(tl.int64) * stride_w,
                        tl.minimum(KS, K - split * KS) * 2)
        pdl_wait()
        t_ok, n_ok = rt < T, rn < N
        # the positions now, not in the last arriver after its partial sums: its ape-row loads then wait one L2
        # latency, not two (session 43, H200, µs per call in a graph at T = 1..16: Flash HCA 4.6-4.7 -> 4.3-4.4,
        # CSA 6.9-7.1 -> 6.9-7.1)
        pos = tl.load(POS + rt, mask=t_ok, other=0).to(tl.int64)
        acc = tl.zeros([TM, BN], dtype=tl.float32)
        for k0 in range(0, KS, BK):
            rk = split * KS + k0 + tl.arange(0, BK)
            k_ok = rk < K
            x = tl.load(A + rt[:, None].to(tl.int64) * stride_a + rk[None, :], mask=t_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(W + rn[:, None].to(tl.int64) * stride_w + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if INTERP:  # the CPU interpreter multiplies raw bf16 bits in `dot`; fp32 products are exact too
                acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:  # bf16 operands: exact products, fp32 accumulation
                acc = tl.dot(x, tl.trans(w), acc)
        tile_ok = t_ok[:, None] & n_ok[None, :]
        offs = rt[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(PART + split * T * N + offs, acc, mask=tile_ok)
        # publish the partials, count the arrival (router.gate_route's ordering: CTA barrier, gpu-scope
        # acq_rel atomic; in the last arriver a second barrier, then .cg loads from L2)
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == S - 1:
            tl.debug_barrier()
            z = tl.zeros([TM, BN], dtype=tl.float32)
            for sp in tl.static_range(S):
                z += tl.load(PART + sp * T * N + offs, mask=tile_ok, other=0.0, cache_modifier=".cg")
            z = _finish_block(z, rt[:, None].to(tl.int64), rn[None, :], tile_ok, pos[:, None], APE0, APE1, W_OUT,
                              scale, COL0, WIDTH0, R0, COL1, WIDTH1, R1, COLW, NW)
            tl.store(Y + offs, z, mask=tile_ok)
            tl.store(CNT + tile, 0)  # every program of the tile arrived: zero it for the next launch


def _epilogue_args(who: str, t: int, n_cols: int, device, positions: torch.Tensor, gates: Sequence[Gate],
                   head_weights: HeadWeights | None, dummy: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
    """Checks the epilogue's arguments for a [t, n_cols] y on `device`; returns the launch keywords of
    `_finish_block` (`dummy` stands in for absent tensors: never read, their widths are 0) and the
    head-weight output (None without head weights)."""
    if positions.shape != (t,) or positions.dtype not in (torch.int32, torch.int64) or positions.device != device:
        raise ValueError(f"{who}: positions must be int [{t}] on {device}, got {positions.dtype} "
                         f"{tuple(positions.shape)} on {positions.device}")
    if len(gates) > 2:
        raise ValueError(f"{who}: at most two gates, got {len(gates)}")
    spans = []
    for i, (col, ape) in enumerate(gates):
        if ape.dtype != torch.float32 or ape.dim() != 2 or not ape.is_contiguous() or ape.device != device:
            raise ValueError(f"{who}: gates[{i}] ape must be contiguous fp32 [ratio, width] on "
                             f"{device}, got {ape.dtype} {tuple(ape.shape)} on {ape.device}")
        spans.append((col, ape.shape[1], f"gates[{i}]"))
    if head_weights is not None:
        spans.append((head_weights[0], head_weights[1], "head_weights"))
    for col, width, what in spans:
        if col < 0 or col + width > n_cols:
            raise ValueError(f"{who}: {what} columns [{col}, {col + width}) outside y's {n_cols}")
    for i, (c0, w0, what0) in enumerate(spans):  # one pass per column: the spans must not overlap
        for c1, w1, what1 in spans[i + 1:]:
            if c0 < c1 + w1 and c1 < c0 + w0 and w0 and w1:
                raise ValueError(f"{who}: {what0} and {what1} columns overlap")
    args: dict = {}
    for i, (col, ape) in enumerate((list(gates) + [(0, None), (0, None)])[:2]):
        args |= {f"APE{i}": dummy if ape is None else ape, f"COL{i}": col,
                 f"WIDTH{i}": 0 if ape is None else ape.shape[1], f"R{i}": 1 if ape is None else ape.shape[0]}
    col_w, n_w, scale = head_weights if head_weights is not None else (0, 0, 1.0)
    w_out = torch.empty(t, n_w, dtype=torch.bfloat16, device=device) if head_weights is not None else None
    args |= dict(W_OUT=dummy if w_out is None else w_out, scale=float(scale), COLW=col_w, NW=n_w)
    return args, w_out


def finish_projections(y: torch.Tensor, positions: torch.Tensor, gates: Sequence[Gate],
                       head_weights: HeadWeights | None = None) -> torch.Tensor | None:
    """Triton `finish_projections_ref` (up to two gates): one launch, one program per token."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.projections: triton is not installed (use finish_projections_ref)")
    if y.dim() != 2 or y.dtype != torch.float32 or y.stride(1) != 1:
        raise ValueError(f"finish_projections: y must be fp32 [T, N] with unit column stride, got {y.dtype} "
                         f"{tuple(y.shape)} strides {y.stride()}")
    t, n_cols = y.shape
    args, w_out = _epilogue_args("finish_projections", t, n_cols, y.device, positions, gates, head_weights, y)
    if t:
        _finish_kernel[(t,)](y, positions.contiguous(), stride_y=y.stride(0), **args, BLOCK=COL_BLOCK, num_warps=4)
    return w_out


def decode_config(n: int, k: int) -> dict:
    """Default tiling of `project_decode`: 32-row tiles of W, K slices of 1024 (512 where that leaves
    fewer than 256 programs), 128-wide dot steps. Flash CSA (N = 2624, K = 4096): 82 tiles x 4 slices
    = 328 programs, 64 KB of W each; HCA (N = 1024): 32 x 8 = 256. H200, session 8 (bench_glue --proj):
    7.5 / 5.0 µs; 16-row tiles 7.3 / 5.0, 32 x 2048 8.9 / 7.1, 64 x 1024 7.9 / 6.2 -- kept."""
    block_k = min(128, triton.next_power_of_2(k))
    block_n = 32
    tiles = triton.cdiv(n, block_n)
    ks = 1024
    while ks > block_k and tiles * triton.cdiv(k, ks) < 256:
        ks //= 2
    return dict(block_n=block_n, k_slice=max(ks, block_k), block_k=block_k, num_warps=4, num_stages=3)


def project_decode(a: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, gates: Sequence[Gate],
                   head_weights: HeadWeights | None = None, block_n: int | None = None, k_slice: int | None = None,
                   block_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`y = a @ weight.T` in fp32 (bf16 a [T, K], T <= DECODE_MAX_T; bf16 weight [N, K]) and
    `finish_projections(y, positions, gates, head_weights)` in one launch -> (y [T, N] fp32 contiguous,
    head weights [T, n] bf16 or None). y sums exact bf16 products in fp32: each `k_slice` by the dot,
    then the slices in order (independent of which program arrives last). No host syncs; the arrival
    counters are allocated on the first call for a device (run once eagerly before a CUDA-graph capture)."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.projections.project_decode needs triton")
    if a.dim() != 2 or weight.dim() != 2 or a.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 \
            or a.shape[1] != weight.shape[1] or a.shape[1] == 0 or weight.shape[0] == 0:
        raise ValueError(f"project_decode: a must be bf16 [T, K] and weight bf16 [N, K], got a {a.dtype} "
                         f"{tuple(a.shape)}, weight {weight.dtype} {tuple(weight.shape)}")
    if a.shape[0] > DECODE_MAX_T:
        raise ValueError(f"project_decode: at most {DECODE_MAX_T} rows, got {a.shape[0]}")
    if a.device != weight.device:
        raise ValueError(f"project_decode: a is on {a.device}, weight on {weight.device}")
    if a.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("project_decode: a and weight rows must be contiguous (stride(1) == 1)")
    (t, k), n = a.shape, weight.shape[0]
    dev = a.device
    y = torch.empty(t, n, dtype=torch.float32, device=dev)
    args, w_out = _epilogue_args("project_decode", t, n, dev, positions, gates, head_weights, y)
    cfg = decode_config(n, k)
    bn, ks, bk = block_n or cfg["block_n"], k_slice or cfg["k_slice"], block_k or cfg["block_k"]
    if any(v & (v - 1) for v in (bn, ks, bk)) or bn < 16 or bk < 16 or ks < bk:
        raise ValueError(f"project_decode: block_n ({bn}), k_slice ({ks}) and block_k ({bk}) must be powers of "
                         "two, block_n and block_k >= 16, k_slice >= block_k")
    if t == 0:
        return y, w_out
    splits, tiles = triton.cdiv(k, ks), triton.cdiv(n, bn)
    partials = torch.empty(splits, t, n, dtype=torch.float32, device=dev)
    counters = arrival_counters("projections project_decode", dev, tiles)
    _decode_kernel[(tiles * splits,)](
        A=a, W=weight, PART=partials, Y=y, CNT=counters, POS=positions.contiguous(), T=t, N=n,
        stride_a=a.stride(0), stride_w=weight.stride(0), K=k, BN=bn, KS=ks, BK=bk, S=splits, TM=DECODE_MAX_T,
        INTERP=INTERPRET, **args,
        PREFETCH=(weight_prefetch_kblocks(weight.numel() * weight.element_size()) > 0 and k % 8 == 0
                  and weight.stride(0) % 8 == 0 and weight.data_ptr() % 16 == 0),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y, w_out
