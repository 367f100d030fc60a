"""Few-token FP8 block linear on CUDA cores: the contract of `fp8_linear_ref` (and, with `quant_x=False` and
groups, of `grouped_linear_w8a16_ref`) for 1..GEMV_MAX_ROWS activation rows. The model runs it for one row
(decode at batch 1) where `linear_config.pick_gemv_config` picks it; from two rows the tensor-core GEMM was
faster but for the two smallest Flash linears (`linear_config.GEMV_MAX_M`, docs/benchmarks.md session 17).

Why a second kernel: at M = 1 the tensor-core GEMM (`fp8_linear`, swap AB) keeps a 128-row weight tile per
K block in shared memory, so two programs share an SM and each waits on its own loads (Nsight Compute,
session 13: 12 % of warps active, 55 % of HBM bandwidth for wq_b). Here a program holds no shared memory:
it loads a [BN, KU*128] weight tile straight into registers (KU K blocks at once, many 16-byte loads in
flight per thread), multiplies it by each quantised activation row in fp32 and reduces along K, so many
small programs per SM keep more bytes in flight. The weight tile is read once for all rows.

Math per 128-wide K block b (checkpoint_format.md §7): the activation block is quantised with its
power-of-two scale s_b (`fp8_linear._quant_rows`), the exact fp32 products w·q are summed, and the sum is
scaled by S[n//128, b] · s_b, as the GEMM does (another summation order: agreement to fp32 rounding).
W8A16 (`quant_x=False`, the grouped wo_a): the bf16 activation is used as is; with float32 weight scales
(Flash-Base; not powers of two) each weight is first rounded to bf16 as w · S, as the reference's
dequantised bf16 weight is.
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton
from dsv4.kernels._triton import pdl_kernel, pdl_wait, prefetch_l2, split_k_sum, weight_prefetch_kblocks
from dsv4.kernels.fp8_linear import _scale_operand
from dsv4.kernels import linear_config
from dsv4.kernels.linear_config import GEMV_MAX_ROWS, GemvConfig, gemv_split  # noqa: F401 (re-exported)

BLOCK = 128


if HAS_TRITON:
    from dsv4.kernels.fp8_linear import _bf16_rne, _e4m3, _e8m0_to_f32, _pow2_scale, _to_bf16

    @pdl_kernel
    @triton.jit(do_not_specialize=["M"])
    def _fp8_gemv_kernel(
        X, W, SW, C, P, CNT,
        M, N, ROWS_PER_GROUP, stride_xm, stride_xg, stride_wn, stride_swn, KB_PER_SPLIT,
        MR: tl.constexpr, BN: tl.constexpr, KU: tl.constexpr, QUANT_X: tl.constexpr, SW_E8M0: tl.constexpr,
        SPLIT_OUT: tl.constexpr, OUT_F32: tl.constexpr, PREFETCH: tl.constexpr, ROUND_W: tl.constexpr,
        INTERP: tl.constexpr,
    ):
        BK: tl.constexpr = 128
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = pid_n * BN + tl.arange(0, BN)
        ku = tl.arange(0, KU)
        cols = tl.arange(0, BK)
        mrow = tl.arange(0, MR)
        kb0 = pid_k * KB_PER_SPLIT
        group = (pid_n * BN) // ROWS_PER_GROUP
        X += group * stride_xg
        SW += ((pid_n * BN) // BK) * stride_swn
        w_ptrs = W + rows[:, None, None].to(tl.int64) * stride_wn + ku[None, :, None] * BK + cols[None, None, :]
        if PREFETCH > 0:
            prefetch_l2(W + kb0 * BK, rows.to(tl.int64) * stride_wn, tl.minimum(KB_PER_SPLIT, PREFETCH) * BK)
        pdl_wait()
        acc = tl.zeros((MR, BN), dtype=tl.float32)
        for kb in range(kb0, kb0 + KB_PER_SPLIT, KU):
            w = tl.load(w_ptrs + kb * BK)
            sw = tl.load(SW + kb + ku)
            if SW_E8M0:
                sw = _e8m0_to_f32(sw.to(tl.int32))
            wf = w.to(tl.float32)
            if ROUND_W:  # W8A16 with float32 scales: the reference's bf16 weight, round(w * scale)
                wf = wf * sw[None, :, None]
                wf = _to_bf16(wf, INTERP).to(tl.float32)
            for r in tl.static_range(MR):  # each activation row against the weight tile in registers
                x = tl.load(X + r * stride_xm + kb * BK + ku[:, None] * BK + cols[None, :], mask=r < M,
                            other=0.0).to(tl.float32)
                swr = sw
                if QUANT_X:
                    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
                    s, inv = _pow2_scale(amax)
                    x = _e4m3(tl.clamp(x * inv[:, None], -448.0, 448.0)).to(tl.float32)
                    swr = sw * s
                part = tl.sum(wf * x[None, :, :], axis=2)  # [BN, KU]: exact products, fp32 sums
                if ROUND_W:
                    val = tl.sum(part, axis=1)
                else:
                    val = tl.sum(part * swr[None, :], axis=1)
                acc += tl.where(mrow[:, None] == r, val[None, :], 0.0)
        mask = (mrow < M)[:, None]
        c_ptrs = C + mrow[:, None] * N + rows[None, :]
        finish = True
        if SPLIT_OUT:  # partials [split, MR, N]: rows past M too (zeros), so the helper needs no mask
            finish, acc = split_k_sum(P, CNT, pid_n, pid_k, tl.num_programs(1), acc,
                                      mrow[:, None] * N + rows[None, :], MR * N)
        if finish:
            if OUT_F32:
                tl.store(c_ptrs, acc, mask=mask)
            else:
                tl.store(c_ptrs, _bf16_rne(acc), mask=mask)  # (RNE under the interpreter too)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, *, groups: int = 1,
             quant_x: bool = True, out_dtype: torch.dtype = torch.bfloat16,
             config: GemvConfig | None = None) -> torch.Tensor:
    """A few rows (<= GEMV_MAX_ROWS): x bf16 [..., K] (groups == 1) or [..., G, K] -> [..., N] / [..., G, N // G].
    quant_x: FP8 x FP8 block linear (`fp8_linear_ref`); False: W8A16 (`grouped_linear_w8a16_ref`)."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.fp8_gemv needs triton")
    cfg = config or GemvConfig()
    k = x.shape[-1]
    n = weight.shape[0]
    m = x.numel() // (groups * k) if k and groups else 0
    if groups > 1 and x.shape[-2] != groups or m * groups * k != x.numel() or not 1 <= m <= GEMV_MAX_ROWS:
        raise ValueError(f"fp8_gemv: expected 1..{GEMV_MAX_ROWS} rows of {groups} x {k}, got {tuple(x.shape)}")
    if BLOCK % cfg.bn or (n // groups) % cfg.bn or k % (BLOCK * cfg.ku):
        raise ValueError(f"fp8_gemv: {cfg} does not tile N={n} (groups {groups}) x K={k}")
    x3 = x.reshape(m, groups, k)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    sw, e8 = _scale_operand(scale)
    if sw.stride(-1) != 1:  # the kernel steps along K blocks with unit stride
        sw = sw.contiguous()
    tiles, kblocks = n // cfg.bn, k // BLOCK
    split = cfg.split_k or gemv_split(tiles, kblocks, cfg.ku)
    if kblocks % split or (kblocks // split) % cfg.ku:
        raise ValueError(f"fp8_gemv: {cfg} does not tile K={k}: split {split} x steps of {cfg.ku} K blocks")
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    common = dict(MR=triton.next_power_of_2(m), BN=cfg.bn, KU=cfg.ku, QUANT_X=quant_x, SW_E8M0=e8,
                  OUT_F32=out_dtype == torch.float32, PREFETCH=weight_prefetch_kblocks(weight.numel()),
                  ROUND_W=not (quant_x or e8), INTERP=INTERPRET, num_warps=cfg.num_warps, num_stages=1)
    if linear_config.GEMV_MAXNREG and not INTERPRET:  # (read when called: an A/B flag)
        common["maxnreg"] = linear_config.GEMV_MAXNREG
    args = (m, n, n // groups, x3.stride(0), x3.stride(1), weight.stride(0), sw.stride(0), kblocks // split)
    if split == 1:
        _fp8_gemv_kernel[(tiles, 1)](x3, weight, sw, out, out, out, *args, SPLIT_OUT=False, **common)
    else:
        part = torch.empty((split, common["MR"], n), dtype=torch.float32, device=x.device)
        counters = arrival_counters("fp8_gemv split-K", x.device, tiles)
        _fp8_gemv_kernel[(tiles, split)](x3, weight, sw, out, part, counters, *args, SPLIT_OUT=True, **common)
    return out.view(*x.shape[:-2], groups, n // groups) if groups > 1 else out.view(*x.shape[:-1], n)
