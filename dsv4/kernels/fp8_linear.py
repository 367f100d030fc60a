"""FP8 block linear: dynamic per-token activation quantisation + FP8 x FP8 GEMM with 128x128 weight scales.

Semantics (checkpoint_format.md §7): the bf16 input is quantised per row and per 128 channels with a
power-of-two scale, `s = pow2_ceil(max(amax, 1e-4) * fp32(1/448))`, `q = e4m3(clamp(x / s, ±448))`;
then `y[m, n] = Σ_b (Σ_{k∈b} q[m,k] Wq[n,k]) · s[m,b] · S[n//128, b]`, fp32 accumulation, bf16 out.
Weight scales are E8M0 bytes (Flash/Pro) or float32 (Flash-Base).

Each public function has a torch reference of the same signature (`*_ref`), built on `dsv4.quant`.
The Triton path exists only where `triton` imports (the CPU CI machine has none).

Two launch shapes of one kernel (which one at which size: `dsv4.kernels.linear_config`):
* prefill (M > 64): A = quantised activations [BM, 128] x W^T, grouped tile order for L2 reuse;
  the activations are quantised once by `act_quant` (quantising inside the GEMM would repeat it
  for every N tile). From 256 rows `fp8_linear` hands the product to cuBLAS instead (dsv4.kernels.fp8_cublas).
* decode (M <= 64): "swap AB" — the weight tile is the MMA's M side (>= 64 rows, so Hopper's wgmma
  applies) and the few tokens are its N side; up to 16 tokens the activation is quantised inside the
  kernel, and the K range is split over programs when N alone gives too few programs to pull the
  weight at full bandwidth. Still one launch (one CUDA-graph node): each split stores an fp32 partial
  tile and bumps a per-tile arrival counter; the last to arrive sums the partials in split order and
  writes the output (see `_split_counters`).
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton  # noqa: F401
from dsv4.kernels._triton import pdl_kernel, pdl_wait, prefetch_l2, weight_prefetch_kblocks
from dsv4.kernels.linear_config import GemvConfig, LinearConfig, launch_split, pick_gemv_config  # noqa: F401
from dsv4.kernels.linear_config import pick_linear_config  # noqa: F401 (re-exported)

BLOCK = 128


# --------------------------------------------------------------------------- torch references


def _weight_scale_f32(scale: torch.Tensor, name: str = "scale") -> torch.Tensor:
    """128x128 weight scales as float32 values (E8M0 bytes decoded, float32 passed through)."""
    from dsv4.quant.e8m0 import e8m0_to_float

    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return e8m0_to_float(scale, name)
    if scale.dtype == torch.float32:
        return scale
    raise ValueError(f"{name}: expected float8_e8m0fnu, uint8 or float32 scales, got {scale.dtype}")


def act_quant_ref(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference activation quantisation: (q e4m3fn like x, s fp32 [..., K/block])."""
    from dsv4.quant.fp8 import quantize_act

    return quantize_act(x, block)


def fp8_gemm_ref(q: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Reference FP8 GEMM on pre-quantised activations: [..., N] in out_dtype.

    Dequantising both operands to fp32 is exact (power-of-two scales), so one fp32 product equals
    the per-block accumulation up to fp32 summation order.
    """
    from dsv4.quant.fp8 import dequantize_fp8_block

    a = q.to(torch.float32) * s.repeat_interleave(BLOCK, dim=-1)
    w = dequantize_fp8_block(weight, scale, torch.float32)
    return (a @ w.t()).to(out_dtype)


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Reference FP8 block linear: bf16 x [..., K] -> [..., N] in out_dtype."""
    q, s = act_quant_ref(x)
    return fp8_gemm_ref(q, s, weight, scale, out_dtype)


def grouped_linear_bf16(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Grouped `wo_a` in bf16 (reference-exact; kernel mode's prefill path): x [M, G, K], weight [G*Ro, K]
    -> contiguous [M, G, Ro].

    The reference dequantises wo_a to bf16 and runs a bf16 einsum without activation quantisation
    (fp32 accumulation). Here one cuBLAS GEMM per group stores straight into its strided columns
    (leading dimension G*Ro): a batched GEMM writes [G, M, Ro], and the permute copy after it took
    166 µs per Flash layer at 8K tokens (s12d).
    """
    m, g, k = x.shape
    w = weight.view(g, -1, k)
    y = torch.empty((m, g, w.shape[1]), dtype=x.dtype, device=x.device)
    for j in range(g):
        torch.mm(x[:, j], w[j].t(), out=y[:, j])
    return y


def grouped_linear_bf16_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    g = x.shape[1]
    return torch.einsum("mgk,grk->mgr", x, weight.view(g, -1, x.shape[2]))


def grouped_fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 variant of grouped wo_a: x [M, G, K] bf16, weight e4m3 [G*Ro, K], scale [G*Ro/128, K/128]."""
    m, g, k = x.shape
    ro = weight.shape[0] // g
    outs = [
        fp8_linear_ref(x[:, i], weight[i * ro : (i + 1) * ro], scale[i * ro // BLOCK : (i + 1) * ro // BLOCK])
        for i in range(g)
    ]
    return torch.stack(outs, dim=1)


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:
    _INTERP = tl.constexpr(INTERPRET)

    @triton.jit
    def _e4m3(v):
        """fp32 v (|v| <= 448) -> e4m3, round to nearest even. Triton's interpreter (CPU checks) casts
        without carrying the rounding into the exponent and rounds ties away from zero, so there the value
        is rounded first."""
        if _INTERP:
            e = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
            quantum = ((tl.maximum(e, 121) - 3) << 23).to(tl.float32, bitcast=True)  # 2^(max(E, -6) - 3)
            v = ((v / quantum + 12582912.0) - 12582912.0) * quantum
        return v.to(tl.float8e4nv)

    @triton.jit
    def _pow2_scale(amax):
        """s = pow2_ceil(amax * fp32(1/448)) on fp32 bits, and 1/s exactly (both powers of two)."""
        v = amax * 0.002232142857142857
        bits = v.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        s = (e << 23).to(tl.float32, bitcast=True)
        inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
        return s, inv

    @triton.jit
    def _quant_rows(x):
        """Quantise each row of an fp32 [R, 128] tile: (e4m3 tile, fp32 scale [R])."""
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
        s, inv = _pow2_scale(amax)
        q = _e4m3(tl.clamp(x * inv[:, None], -448.0, 448.0))
        return q, s

    @triton.jit
    def _e8m0_to_f32(b):
        """E8M0 byte (as int32) -> fp32; byte 0 is the subnormal 2^-127, 255 is NaN."""
        bits = tl.where(b == 0, 0x00400000, tl.where(b == 255, 0x7FC00000, b << 23))
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _bf16_rne(x):
        """fp32 -> bf16 rounding to nearest even on the bits (for the interpreter, whose cast truncates)."""
        bits = x.to(tl.uint32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        r = tl.where(x != x, 0x7FC0, r)  # NaN stays NaN (the carry could reach the sign bit)
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _to_bf16(x, INTERP: tl.constexpr):
        """fp32 -> bf16 rounding to nearest even: the cast (cvt.rn) on the GPU, `_bf16_rne` under the interpreter."""
        if INTERP:
            return _bf16_rne(x)
        return x.to(tl.bfloat16)

    @pdl_kernel
    @triton.jit(do_not_specialize=["M"])
    def _act_quant_kernel(X, Q, S, M, stride_xm, stride_qm, stride_sm, stride_sk, BR: tl.constexpr):
        pdl_wait()
        pid_r = tl.program_id(0)
        kb = tl.program_id(1)
        rows = pid_r * BR + tl.arange(0, BR)
        cols = kb * 128 + tl.arange(0, 128)
        mask = rows < M
        x = tl.load(X + rows[:, None] * stride_xm + cols[None, :], mask=mask[:, None], other=0.0)
        q, s = _quant_rows(x.to(tl.float32))
        tl.store(Q + rows[:, None] * stride_qm + cols[None, :], q, mask=mask[:, None])
        tl.store(S + rows * stride_sm + kb * stride_sk, s, mask=mask)

    @pdl_kernel
    @triton.jit(do_not_specialize=["M"])
    def _fp8_gemm_kernel(
        A, SA, W, SW, C, P, CNT,
        M, N, K,
        stride_am, stride_ag, stride_sam, stride_sag,
        stride_wn, stride_wg, stride_swn, stride_swg,
        stride_cm, stride_cg,
        stride_pm, stride_pg, stride_ps,
        KB_PER_SPLIT,
        BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
        SWAP_AB: tl.constexpr, FUSE_QUANT: tl.constexpr, SW_E8M0: tl.constexpr, SPLIT_OUT: tl.constexpr,
        KBP: tl.constexpr,  # next power of two >= KB_PER_SPLIT
        PREFETCH: tl.constexpr,  # K blocks of the weight rows started into L2 before the PDL wait
    ):
        BK: tl.constexpr = 128
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_g = tl.program_id(2)
        num_m = tl.cdiv(M, BM)
        num_n = tl.cdiv(N, BN)
        # grouped ordering: GROUP_M row tiles share each weight tile while it is in L2
        width = GROUP_M * num_n
        first_m = (pid // width) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % width) % size_m
        pid_n = (pid % width) // size_m

        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mask_m = offs_m < M
        mask_n = offs_n < N
        A += pid_g * stride_ag
        SA += pid_g * stride_sag
        W += pid_g * stride_wg
        SW += pid_g * stride_swg
        C += pid_g * stride_cg
        a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :]
        w_ptrs = W + offs_n[:, None] * stride_wn + offs_k[None, :]
        sa_ptrs = SA + offs_m * stride_sam

        kb0 = pid_k * KB_PER_SPLIT  # the wrapper makes KB_PER_SPLIT divide K // 128
        if SWAP_AB:
            acc = tl.zeros((BN, BM), dtype=tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
        # Scale loads feed no MMA operand, so Triton's pipeliner leaves them in the loop, where each
        # one would wait a memory latency: load every K block's scales once up front (a short vector;
        # the [BM, KBP] activation scales only when that tile is small) and select one per step.
        kidx = tl.arange(0, KBP)
        kmask = kidx < KB_PER_SPLIT
        sw_all = tl.load(SW + (pid_n * BN // BK) * stride_swn + kb0 + kidx, mask=kmask, other=0)
        # Before the wait only the weights (nothing earlier in the stream writes them): their scales, and
        # the first K blocks of this program's rows started into L2 (`_triton.pdl_wait`).
        if PREFETCH > 0:
            rows_n = tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn
            prefetch_l2(W + kb0 * BK, rows_n, tl.minimum(KB_PER_SPLIT, PREFETCH) * BK)
        pdl_wait()
        if SW_E8M0:
            sw_all = _e8m0_to_f32(sw_all.to(tl.int32))
        PRELOAD_SA: tl.constexpr = (not FUSE_QUANT) and (BM * KBP <= 2048)  # larger tiles measured slower
        if PRELOAD_SA:
            sa_all = tl.load(sa_ptrs[:, None] + kb0 + kidx[None, :], mask=mask_m[:, None] & kmask[None, :], other=0.0)
        for kb in range(kb0, kb0 + KB_PER_SPLIT):
            a = tl.load(a_ptrs + kb * BK, mask=mask_m[:, None], other=0.0)
            if FUSE_QUANT:
                a, sa = _quant_rows(a.to(tl.float32))
            elif PRELOAD_SA:
                sa = tl.sum(tl.where(kidx[None, :] == kb - kb0, sa_all, 0.0), axis=1)
            else:
                sa = tl.load(sa_ptrs + kb, mask=mask_m, other=0.0)
            w = tl.load(w_ptrs + kb * BK, mask=mask_n[:, None], other=0.0)
            sw = tl.sum(tl.where(kidx == kb - kb0, sw_all, 0.0), axis=0)  # one 128-row block: BN <= 128
            if SWAP_AB:
                acc += tl.dot(w, tl.trans(a)) * (sw * sa[None, :])
            else:
                acc += tl.dot(a, tl.trans(w)) * (sa[:, None] * sw)

        if SWAP_AB:
            c_offs_m, c_offs_n = offs_m[None, :], offs_n[:, None]
            c_mask = mask_m[None, :] & mask_n[:, None]
        else:
            c_offs_m, c_offs_n = offs_m[:, None], offs_n[None, :]
            c_mask = mask_m[:, None] & mask_n[None, :]
        c_ptrs = C + c_offs_m * stride_cm + c_offs_n
        if SPLIT_OUT:
            # Split K: store this split's fp32 partial, count the arrival; the last of the
            # num_programs(1) splits of this (tile, group) reduces in split order 0..S-1 (fp32, from
            # 0.0: bit-identical to a separate reduction pass) and writes C.
            # Ordering: the CTA barrier orders every thread's partial stores before the one thread
            # that issues the atomic, whose gpu-scope release is cumulative over them (the pattern of
            # cooperative groups' grid sync: bar.sync, then one thread's fence + atomic). In the last
            # arriver, that thread's acquire, then a second CTA barrier, order every thread's
            # partial loads after all the other splits' releases; the loads read L2 (.cg), past the
            # SM's L1, which is not coherent with the other SMs' stores.
            split = tl.num_programs(1)
            p_ptrs = P + pid_g * stride_pg + c_offs_m * stride_pm + c_offs_n
            tl.store(p_ptrs + pid_k * stride_ps, acc, mask=c_mask)
            tl.debug_barrier()
            cnt_ptr = CNT + pid_g * tl.num_programs(0) + pid
            arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
            if arrived == split - 1:  # uniform over the CTA: the atomic's result is broadcast
                tl.debug_barrier()
                total = tl.zeros_like(acc)
                for s in range(0, split):
                    total += tl.load(p_ptrs + s * stride_ps, mask=c_mask, other=0.0, cache_modifier=".cg")
                tl.store(c_ptrs, total.to(C.dtype.element_ty), mask=c_mask)
                # every split of this tile has arrived, so nothing else touches the counter in this
                # launch: zero it for the next launch (and for CUDA-graph replays)
                tl.store(cnt_ptr, 0)
        else:
            tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=c_mask)


def _check_weight(weight: torch.Tensor, scale: torch.Tensor, k: int, name: str = "weight") -> None:
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D float8_e4m3fn weight, got {weight.dtype} {tuple(weight.shape)}")
    n, kw = weight.shape
    if kw != k or k % BLOCK or n % BLOCK:
        raise ValueError(f"{name}: shape {tuple(weight.shape)} does not fit input features {k} (multiples of 128)")
    if tuple(scale.shape) != (n // BLOCK, k // BLOCK):
        raise ValueError(f"{name}: scale shape {tuple(scale.shape)}, expected {(n // BLOCK, k // BLOCK)}")
    if not weight.is_contiguous() or not scale.is_contiguous():
        raise ValueError(f"{name}: weight and scale must be contiguous")


def _scale_operand(scale: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return scale.view(torch.uint8), True
    if scale.dtype == torch.float32:
        return scale, False
    raise ValueError(f"scale: expected float8_e8m0fnu, uint8 or float32, got {scale.dtype}")


# --------------------------------------------------------------------------- Triton entry points


def act_quant(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton activation quantisation, same contract as `act_quant_ref` (block must be 128)."""
    if block != BLOCK:
        raise ValueError(f"act_quant: only block=128 is implemented, got {block}")
    k = x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"act_quant: last dim {k} must be a multiple of 128")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, k // BLOCK), dtype=torch.float32, device=x.device)
    if m:
        _launch_act_quant(x2, q, s, m)
    return q.view(x.shape), s.view(*x.shape[:-1], k // BLOCK)


def _launch_act_quant(x2: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: int) -> None:
    """Quantise the first m rows of x2 into q / s (s may be a transposed view: any strides)."""
    br = 32
    _act_quant_kernel[(triton.cdiv(m, br), x2.shape[1] // BLOCK)](
        x2, q, s, m, x2.stride(0), q.stride(0), s.stride(0), s.stride(1), BR=br, num_warps=4)


def _split_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Split-K arrival counters, one per (output tile, group) of a launch (dsv4.kernels._triton)."""
    return arrival_counters("fp8_linear split-K", device, needed)


def _launch_gemm(a, sa, weight, sw, sw_e8m0, out, m, n, k, groups, strides, cfg: LinearConfig) -> None:
    (s_am, s_ag, s_sam, s_sag, s_wn, s_wg, s_swn, s_swg, s_cm, s_cg) = strides
    tiles_m, tiles_n = triton.cdiv(m, cfg.bm), triton.cdiv(n, cfg.bn)
    kblocks = k // BLOCK
    split = launch_split(m, n, k, cfg, groups)
    kb_per = kblocks // split
    grid = (tiles_m * tiles_n, split, groups)
    if cfg.bn > BLOCK:
        raise ValueError(f"LinearConfig: bn={cfg.bn} > 128 is not supported (one weight-scale block per tile)")
    common = dict(BM=cfg.bm, BN=cfg.bn, GROUP_M=cfg.group_m, SWAP_AB=cfg.swap_ab, FUSE_QUANT=cfg.fuse_quant,
                  SW_E8M0=sw_e8m0, KBP=triton.next_power_of_2(kb_per), PREFETCH=weight_prefetch_kblocks(weight.numel()),
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split == 1:  # P and CNT unused
        _fp8_gemm_kernel[grid](a, sa, weight, sw, out, out, out, m, n, k, s_am, s_ag, s_sam, s_sag, s_wn, s_wg,
                               s_swn, s_swg, s_cm, s_cg, 0, 0, 0, kb_per, SPLIT_OUT=False, **common)
        return
    numel = m * groups * n
    # partials in the output's [m, g, n] layout, contiguous; every element is written before it is read
    part = torch.empty((split, numel), dtype=torch.float32, device=out.device)
    counters = _split_counters(out.device, tiles_m * tiles_n * groups)
    _fp8_gemm_kernel[grid](a, sa, weight, sw, out, part, counters, m, n, k, s_am, s_ag, s_sam, s_sag, s_wn, s_wg,
                           s_swn, s_swg, s_cm, s_cg, groups * n, n, numel, kb_per, SPLIT_OUT=True, **common)


def fp8_gemm(q: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             config: LinearConfig | None = None) -> torch.Tensor:
    """Triton FP8 GEMM on pre-quantised activations (contract of `fp8_gemm_ref`)."""
    k = q.shape[-1]
    _check_weight(weight, scale, k)
    q2 = q.reshape(-1, k)
    s2 = s.reshape(-1, k // BLOCK)
    m, n = q2.shape[0], weight.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=q.device)
    if m == 0:
        return out.view(*q.shape[:-1], n)
    cfg = config or pick_linear_config(m, n, k)
    if cfg.fuse_quant:
        cfg = LinearConfig(**{**cfg.__dict__, "fuse_quant": False})
    sw, e8 = _scale_operand(scale)
    strides = (q2.stride(0), 0, s2.stride(0), 0, weight.stride(0), 0, sw.stride(0), 0, out.stride(0), 0)
    _launch_gemm(q2, s2, weight, sw, e8, out, m, n, k, 1, strides, cfg)
    return out.view(*q.shape[:-1], n)


# From this many rows (bf16 out, no explicit config) `fp8_linear` hands the GEMM to cuBLAS's blockwise FP8
# product (`torch._scaled_mm`, 1x128 activation and 128x128 weight scales) on `act_quant`'s output: faster
# than the Triton GEMM at every Flash/Pro shape from M = 256 (docs/benchmarks.md #5: the Triton GEMM is
# 0.5-0.65x of it at M >= 1024). The same math: exact e4m3 products summed per 128-block, scaled, fp32 sums
# (another order). M below it (decode): the Triton kernel (1.1-2x cuBLAS there, and graph-friendly).
CUBLAS_MIN_ROWS = 256


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               config: LinearConfig | None = None, out_dtype: torch.dtype = torch.bfloat16,
               backend: str = "auto") -> torch.Tensor:
    """FP8 block linear: bf16 x [..., K] -> [..., N] in out_dtype (bf16, or fp32 for a row-parallel
    partial sum that is rounded after the all-reduce); contract of `fp8_linear_ref`. backend "auto":
    cuBLAS from CUBLAS_MIN_ROWS rows when out_dtype is bf16 and no config is given, else Triton: one row
    on the CUDA-core GEMV where `pick_gemv_config` picks it (or config is a GemvConfig), the GEMM below;
    "triton" / "cublas" force one (cuBLAS: bf16 out only; falls back to Triton where cuBLAS refuses)."""
    if backend not in ("auto", "triton", "cublas"):
        raise ValueError(f"fp8_linear: backend must be 'auto', 'triton' or 'cublas', got {backend!r}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"fp8_linear: expected a bf16 input, got {x.dtype}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"fp8_linear: out_dtype must be bfloat16 or float32, got {out_dtype}")
    k = x.shape[-1]
    _check_weight(weight, scale, k)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, n = x2.shape[0], weight.shape[0]
    if backend == "cublas" and out_dtype != torch.bfloat16:
        raise ValueError("fp8_linear: backend 'cublas' gives bf16 out only")
    cublas = backend == "cublas" or (backend == "auto" and config is None and out_dtype == torch.bfloat16
                                     and m >= CUBLAS_MIN_ROWS)
    if cublas and m and x.is_cuda:
        from dsv4.kernels.fp8_cublas import cublas_fp8_linear
        y = cublas_fp8_linear(x2, weight, scale)
        if y is not None:
            return y.view(*x.shape[:-1], n)
    cfg = config or pick_gemv_config(m, n, k) or pick_linear_config(m, n, k)
    if isinstance(cfg, GemvConfig):  # one row: the CUDA-core GEMV (dsv4.kernels.fp8_gemv)
        from dsv4.kernels.fp8_gemv import fp8_gemv
        return fp8_gemv(x2, weight, scale, out_dtype=out_dtype, config=cfg).view(*x.shape[:-1], n)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    sw, e8 = _scale_operand(scale)
    if cfg.fuse_quant:
        a, sa, s_sam = x2, x2, 0  # SA unused
    else:
        a, sa = act_quant(x2)
        s_sam = sa.stride(0)
    strides = (a.stride(0), 0, s_sam, 0, weight.stride(0), 0, sw.stride(0), 0, out.stride(0), 0)
    _launch_gemm(a, sa, weight, sw, e8, out, m, n, k, 1, strides, cfg)
    return out.view(*x.shape[:-1], n)


def grouped_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                       config: LinearConfig | None = None) -> torch.Tensor:
    """Triton FP8 variant of grouped wo_a (contract of `grouped_fp8_linear_ref`): one launch over G groups."""
    if x.dtype != torch.bfloat16 or x.dim() != 3:
        raise ValueError(f"grouped_fp8_linear: expected bf16 [M, G, K], got {x.dtype} {tuple(x.shape)}")
    m, g, k = x.shape
    _check_weight(weight, scale, k)
    if weight.shape[0] % (g * BLOCK):
        raise ValueError(f"grouped_fp8_linear: weight rows {weight.shape[0]} not divisible into {g} groups of 128s")
    ro = weight.shape[0] // g
    x = x.contiguous()
    out = torch.empty((m, g, ro), dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return out
    cfg = config or pick_linear_config(m, ro, k, g)
    sw, e8 = _scale_operand(scale)
    if cfg.fuse_quant:
        a, sa, s_sam, s_sag = x, x, 0, 0
    else:
        a, sa = act_quant(x)  # [M, G, K], [M, G, K/128]
        s_sam, s_sag = sa.stride(0), sa.stride(1)
    strides = (a.stride(0), a.stride(1), s_sam, s_sag, weight.stride(0), ro * k, sw.stride(0),
               (ro // BLOCK) * sw.stride(0), out.stride(0), out.stride(1))
    _launch_gemm(a, sa, weight, sw, e8, out, m, ro, k, g, strides, cfg)
    return out
