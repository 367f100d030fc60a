"""Grouped `wo_a` straight from the FP8 checkpoint weight: bf16 activations x e4m3 weights, bf16 out.

Semantics (deepseek_v4_model.md, grouped output projection): the reference dequantises `wo_a` to bf16
and runs a bf16 einsum without activation quantisation,
    `y[t, g, r] = bf16( Σ_i x[t, g, i] · W[g·R + r, i] · S[(g·R + r) // 128, i // 128] )`,
fp32 accumulation. It reads 1 byte per weight instead of the bf16 copy's 2, and no bf16 copy is kept
(Flash: ~2.9 GB over 43 layers).

"Swap AB" at every T: the weight rows are the MMA's M side, so the converted tile is the register
operand of Hopper's wgmma, and the tokens are its N side. Two numerically exact paths:
* E8M0 scales (Flash/Pro): per 128-wide K block, a bf16 MMA of the e4m3 *values* (exact in bf16) with
  x, then the fp32 partial times the block's power of two (exact) into the accumulator: the reference's
  products, summed in another fp32 order. Keeping the weight operand a pure function of the loaded
  tile lets Triton read it from shared memory straight into the MMA operand layout (a runtime scale
  factor on the tile blocks that and costs a second shared-memory round trip). e4m3 -> bf16 runs on
  the integer ALUs (`_e4m3_bits_to_bf16`); Triton's own cast goes through f16 with one low-throughput
  F2F conversion per value.
* float32 scales (Flash-Base): the weight times its scale in fp32, rounded to bf16 (the reference's
  dequantisation for any float32 value, powers of two or not), one fp32 accumulation chain. This path
  keeps the shared-memory round trip; power-of-two float32 scales converted to E8M0 at load time take
  the fast path.
Launch shapes (`pick_grouped_config`):
* decode, T <= 64: 64 weight rows x 16..64 tokens per program, the K range split over programs
  (`_auto_split`: Flash G·R / 64 = 128 row tiles x 4 splits of 8 K blocks = 512 programs, ~4 per SM,
  so each SM has several weight streams in flight instead of one). Still one launch: each split
  stores its fp32 partial tile and bumps the tile's arrival counter; the last to arrive sums the
  partials in split order 0..S-1 (deterministic, independent of the arrival order), rounds once to
  bf16 and zeroes the counter for the next launch / CUDA-graph replay (the pattern of
  `dsv4.kernels.fp8_linear`, counters from `dsv4.kernels._triton.arrival_counters`).
* prefill, T > 64: 128 weight rows x 128 tokens, 8 warps, whole K per program. Correct at any T, not
  tuned (the weight conversion repeats per token tile; cuBLAS on a bf16 copy may be faster there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton
from dsv4.kernels._triton import pdl_kernel, pdl_wait, prefetch_l2, weight_prefetch_kblocks
from dsv4.kernels.linear_config import pick_gemv_config

BLOCK = 128
DECODE_MAX_T = 64
NUM_SMS = 132  # H200
MIN_SPLIT_KBLOCKS = 4  # auto split: at least this many 128-wide K blocks per program
_SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32)


# --------------------------------------------------------------------------- checks and reference


def _check_args(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> tuple[int, int, int, int]:
    """(T, G, R, Din) of a valid call; ValueError naming the argument otherwise."""
    if x.dtype != torch.bfloat16 or x.dim() != 3:
        raise ValueError(f"grouped_linear_w8a16: x must be bf16 [T, G, Din], got {x.dtype} {tuple(x.shape)}")
    t, g, din = x.shape
    if g < 1 or din < 1 or din % BLOCK:
        raise ValueError(f"grouped_linear_w8a16: x shape {tuple(x.shape)}: need G >= 1 and Din a multiple of 128")
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(f"grouped_linear_w8a16: weight must be 2-D float8_e4m3fn [G*R, Din], "
                         f"got {weight.dtype} {tuple(weight.shape)}")
    rows, kw = weight.shape
    if kw != din or rows % g or (rows // g) % BLOCK or rows == 0:
        raise ValueError(f"grouped_linear_w8a16: weight shape {tuple(weight.shape)} does not fit x {tuple(x.shape)} "
                         f"(expected [G*R, {din}] with R a positive multiple of 128, G = {g})")
    if scale.dtype not in _SCALE_DTYPES:
        raise ValueError(f"grouped_linear_w8a16: scale must be float8_e8m0fnu, uint8 (E8M0 bytes) or float32, "
                         f"got {scale.dtype}")
    if tuple(scale.shape) != (rows // BLOCK, din // BLOCK):
        raise ValueError(f"grouped_linear_w8a16: scale shape {tuple(scale.shape)}, expected "
                         f"{(rows // BLOCK, din // BLOCK)} (one per 128x128 weight block)")
    if not (x.device == weight.device == scale.device):
        raise ValueError(f"grouped_linear_w8a16: x, weight and scale on different devices "
                         f"({x.device}, {weight.device}, {scale.device})")
    return t, g, rows // g, din


def grouped_linear_w8a16_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Reference: x bf16 [T, G, Din], weight e4m3 [G*R, Din], scale [G*R/128, Din/128] -> bf16 [T, G, R].

    The weight is dequantised to bf16 as the reference does (exact for power-of-two scales), then one
    fp32 einsum and one rounding to bf16.
    """
    from dsv4.quant.fp8 import dequantize_fp8_block

    t, g, r, din = _check_args(x, weight, scale)
    w = dequantize_fp8_block(weight, scale, torch.bfloat16, name="weight").to(torch.float32).view(g, r, din)
    return torch.einsum("tgi,gri->tgr", x.to(torch.float32), w).to(torch.bfloat16)


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:
    from dsv4.kernels.fp8_linear import _bf16_rne, _e8m0_to_f32

    @triton.jit
    def _e4m3_bits_to_bf16(q):
        """e4m3 bytes (uint8, two per call) -> bf16 equal to the e4m3 value times 2^-120, exactly (zeros and
        subnormals included; the NaN codes 0x7F/0xFF read as ±480·2^-120, never NaN).
        One byte permute puts byte 0 in bits 8..15 and byte 1 in bits 24..31, with byte 0's sign
        replicated into bits 16..23; an arithmetic shift right by 4 then lands each byte's exponent and
        mantissa in the bf16 fields of its half and its sign in the half's top bit; a mask clears the rest."""
        return tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 t;
            cvt.u32.u16 t, $1;
            prmt.b32 t, t, 0, 0x1804;
            shr.s32 t, t, 4;
            and.b32 $0, t, 0x87F087F0;
            }
            """,
            constraints="=r,h",
            args=[q],
            dtype=tl.bfloat16,
            is_pure=True,
            pack=2,
        )

    @triton.jit
    def _store_bf16(y_ptrs, acc, mask, INTERP: tl.constexpr):
        if INTERP:  # the interpreter's fp32 -> bf16 cast truncates
            out = _bf16_rne(acc)
        else:
            out = acc.to(tl.bfloat16)  # cvt.rn
        tl.store(y_ptrs, out, mask=mask)

    @pdl_kernel
    @triton.jit(do_not_specialize=["T"])
    def _grouped_w8a16_kernel(
        X, W, S, Y, P, CNT,
        T, R,
        stride_xt, stride_xg, stride_s, stride_yt, stride_yg, stride_ps,
        DIN: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
        S_E8M0: tl.constexpr, BITS: tl.constexpr, SPLIT_OUT: tl.constexpr, INTERP: tl.constexpr,
        PREFETCH: tl.constexpr,  # K blocks of the weight rows started into L2 before the PDL wait
    ):
        pid_n = tl.program_id(0)  # BN weight rows, all in one group and one 128-row scale block
        pid_t = tl.program_id(1)  # BM tokens
        pid_k = tl.program_id(2)  # K range (split-K)
        row0 = pid_n * BN
        g = row0 // R
        offs_n = tl.arange(0, BN)
        offs_t = pid_t * BM + tl.arange(0, BM)
        offs_k = tl.arange(0, 128)
        mask_t = offs_t < T
        w_ptrs = W + (row0 + offs_n)[:, None].to(tl.int64) * DIN + offs_k[None, :]
        x_ptrs = X + offs_t[:, None].to(tl.int64) * stride_xt + g * stride_xg + offs_k[None, :]
        s_ptr = S + (row0 // 128) * stride_s
        KBLOCKS: tl.constexpr = DIN // 128
        if SPLIT_OUT:  # split i of S takes K blocks [i·KB/S, (i+1)·KB/S): balanced within one block
            split = tl.num_programs(2)
            kb_lo = pid_k * KBLOCKS // split
            kb_hi = (pid_k + 1) * KBLOCKS // split
        else:
            kb_lo = 0
            kb_hi = KBLOCKS

        # before the PDL wait only the weights: the first K blocks of this program's rows started into L2
        if PREFETCH > 0:
            prefetch_l2(W + kb_lo * 128, (row0 + offs_n).to(tl.int64) * DIN, tl.minimum(kb_hi - kb_lo, PREFETCH) * 128)
        pdl_wait()
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for kb in range(kb_lo, kb_hi):
            s = tl.load(s_ptr + kb)  # issued early, used after the MMA; the scale row is one cached line
            wq = tl.load(w_ptrs + kb * 128)
            x = tl.load(x_ptrs + kb * 128, mask=mask_t[:, None], other=0.0)
            if INTERP:  # the CPU interpreter multiplies bf16 values (dot operands too) as raw bits
                x = x.to(tl.float32)
            if S_E8M0:
                # Σ e4m3·x over the block (exact products), then the exact power-of-two scale
                s = _e8m0_to_f32(s.to(tl.int32))
                if INTERP:
                    w = wq.to(tl.float32)
                elif BITS:
                    w = _e4m3_bits_to_bf16(wq.to(tl.uint8, bitcast=True)) * 1.329227995784916e36  # 2^120
                else:
                    w = wq.to(tl.bfloat16)
                acc += tl.dot(w, tl.trans(x)) * s
            else:
                # any float32 scale: the weight rounded once to bf16 from its fp32 product, as the
                # reference dequantises; exact products, one fp32 accumulation chain
                if INTERP:
                    w = _bf16_rne(wq.to(tl.float32) * s).to(tl.float32)
                else:
                    w = (wq.to(tl.float32) * s).to(tl.bfloat16)
                acc = tl.dot(w, tl.trans(x), acc)

        r = row0 - g * R + offs_n
        y_offs = offs_t[None, :].to(tl.int64) * stride_yt + g * stride_yg + r[:, None]
        if SPLIT_OUT:
            # P holds one fp32 copy of Y's [T, G, R] layout per split. Ordering as in fp8_linear's
            # split-K: the CTA barrier puts every thread's partial stores before the one thread's
            # gpu-scope acq_rel atomic (a cumulative release); in the last arriver, the atomic's
            # acquire and a second barrier put the partial loads (.cg: from L2, past the
            # non-coherent L1) after every other split's release.
            p_ptrs = P + y_offs
            tl.store(p_ptrs + pid_k.to(tl.int64) * stride_ps, acc, mask=mask_t[None, :])
            tl.debug_barrier()
            cnt_ptr = CNT + pid_t * tl.num_programs(0) + pid_n
            arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
            if arrived == split - 1:  # uniform over the CTA: the scalar atomic's result is broadcast
                tl.debug_barrier()
                total = tl.zeros((BN, BM), dtype=tl.float32)
                for _ in range(0, split):  # split order from 0.0: the same bits whoever arrives last
                    total += tl.load(p_ptrs, mask=mask_t[None, :], other=0.0, cache_modifier=".cg")
                    p_ptrs += stride_ps  # 64-bit pointer steps: no int32 product to overflow
                _store_bf16(Y + y_offs, total, mask_t[None, :], INTERP)
                tl.store(cnt_ptr, 0)  # every split has arrived: ready for the next launch / replay
        else:
            _store_bf16(Y + y_offs, acc, mask_t[None, :], INTERP)


# --------------------------------------------------------------------------- launch configuration


@dataclass(frozen=True)
class GroupedConfig:
    """One launch shape of `_grouped_w8a16_kernel`: bn weight rows x bm tokens per program."""

    bn: int  # 64 or 128 (one 128-row scale block per tile); 128 wants 8 warps (4 spill at bm=64)
    bm: int  # power of two, 16..128
    num_warps: int = 4
    num_stages: int = 4
    bit_convert: bool = True  # E8M0 path: ALU bit conversion (`_e4m3_bits_to_bf16`), else Triton's cast
    split_k: int = 0  # programs per output tile along K, reduced in the launch; 0 = `_auto_split`


def _auto_split(tiles: int, kblocks: int, per_sm: int = 4) -> int:
    """Double the K split while the grid stays within ~`per_sm` programs per SM and every split keeps at
    least MIN_SPLIT_KBLOCKS K blocks: one program streams one weight tile with a few loads in flight, so
    several per SM are what pulls the weight at full bandwidth (Flash decode: 128 tiles -> split 4).
    H200, Flash, µs (session 7): T = 1 split 1/2/4/8 24.7/23.2/21.4/22.5; T = 64 (bm 64: 88 KB of shared
    memory, 2 programs per SM, hence per_sm = 2 there) 29.9/28.3/32.4/41.6."""
    split = 1
    while tiles * split * 2 <= per_sm * NUM_SMS and kblocks // (split * 2) >= MIN_SPLIT_KBLOCKS:
        split *= 2
    return split


def pick_grouped_config(t: int) -> GroupedConfig:
    """Decode (T <= 64): 64 rows x the tokens rounded up to a power of two (>= 16, the wgmma N minimum),
    K split automatically. Prefill: 128 x 128 tiles on 8 warps (one wgmma m64n128 per warpgroup), whole
    K per program (split-K untimed there)."""
    if t <= DECODE_MAX_T:
        return GroupedConfig(bn=64, bm=max(16, triton.next_power_of_2(t)), num_warps=4, num_stages=3, split_k=0)
    return GroupedConfig(bn=128, bm=128, num_warps=8, num_stages=3, split_k=1)


def _check_config(cfg: GroupedConfig, r: int) -> None:
    if cfg.bn not in (64, 128) or r % cfg.bn:
        raise ValueError(f"GroupedConfig: bn={cfg.bn} must be 64 or 128 and divide R={r}")
    if cfg.bm not in (16, 32, 64, 128):
        raise ValueError(f"GroupedConfig: bm={cfg.bm} must be 16, 32, 64 or 128")
    if cfg.split_k < 0:
        raise ValueError(f"GroupedConfig: split_k={cfg.split_k} must be >= 0 (0 = auto)")


def _split_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Arrival counters, one per output tile of a launch (allocated before any CUDA-graph capture)."""
    return arrival_counters("grouped_w8a16 split-K", device, needed)


# --------------------------------------------------------------------------- entry point


def grouped_linear_w8a16(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                         config: GroupedConfig | None = None) -> torch.Tensor:
    """Triton grouped `wo_a` (contract of `grouped_linear_w8a16_ref`): one launch, no host syncs.

    x bf16 [T, G, Din] (any strides with a unit last one), weight e4m3 [G*R, Din] contiguous,
    scale [G*R/128, Din/128] E8M0 (float8_e8m0fnu / uint8) or float32 -> bf16 [T, G, R], any T.
    """
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.grouped_w8a16.grouped_linear_w8a16 needs triton")
    t, g, r, din = _check_args(x, weight, scale)
    if not weight.is_contiguous():
        raise ValueError("grouped_linear_w8a16: weight must be contiguous")
    if x.stride(-1) != 1:
        x = x.contiguous()
    gemv = None if config is not None else pick_gemv_config(t, g * r, din, groups=g, quant_x=False)
    if gemv is not None:  # one token: the CUDA-core GEMV (18.6 -> 13.1 µs for Flash, session 17)
        from dsv4.kernels.fp8_gemv import fp8_gemv
        return fp8_gemv(x, weight, scale, groups=g, quant_x=False, config=gemv)
    s_e8m0 = scale.dtype != torch.float32
    sw = scale.view(torch.uint8) if s_e8m0 else scale
    if sw.stride(-1) != 1:
        sw = sw.contiguous()
    out = torch.empty((t, g, r), dtype=torch.bfloat16, device=x.device)
    if t == 0:
        return out
    cfg = config or pick_grouped_config(t)
    _check_config(cfg, r)
    tiles_n, tiles_t, kblocks = g * r // cfg.bn, triton.cdiv(t, cfg.bm), din // BLOCK
    if tiles_t > 65535:
        raise ValueError(f"grouped_linear_w8a16: T={t} exceeds the grid limit ({65535 * cfg.bm} tokens at bm={cfg.bm})")
    per_sm = 2 if cfg.bm >= 64 else 4  # programs that fit an SM's shared memory (measured, see _auto_split)
    split = min(cfg.split_k or _auto_split(tiles_n * tiles_t, kblocks, per_sm), kblocks)  # no empty K ranges
    common = dict(DIN=din, BN=cfg.bn, BM=cfg.bm, S_E8M0=s_e8m0, BITS=cfg.bit_convert, SPLIT_OUT=split > 1,
                  INTERP=INTERPRET, PREFETCH=weight_prefetch_kblocks(weight.numel()), num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages)
    strides = (x.stride(0), x.stride(1), sw.stride(0), out.stride(0), out.stride(1))
    if split == 1:  # P and CNT unused
        _grouped_w8a16_kernel[(tiles_n, tiles_t, 1)](x, weight, sw, out, out, out, t, r, *strides, 0, **common)
        return out
    # fp32 partials, one copy of the output's contiguous [T, G, R] layout per split; every element that
    # is read was written in the same launch (rows always full, tokens masked alike on both sides)
    part = torch.empty((split, t * g * r), dtype=torch.float32, device=x.device)
    counters = _split_counters(x.device, tiles_n * tiles_t)
    _grouped_w8a16_kernel[(tiles_n, tiles_t, split)](x, weight, sw, out, part, counters, t, r, *strides,
                                                     part.stride(0), **common)
    return out


# --------------------------------------------------------------------------- prefill: the weight in bf16

if HAS_TRITON:

    @triton.jit
    def _dequant_kernel(W, S, OUT, stride_w, stride_s, stride_o, S_E8M0: tl.constexpr):
        """One 128x128 block: e4m3 values times the block's scale in fp32, rounded to bf16."""
        bn, bk = tl.program_id(0).to(tl.int64), tl.program_id(1)
        rows = bn * 128 + tl.arange(0, 128)
        cols = bk * 128 + tl.arange(0, 128)
        w = tl.load(W + rows[:, None] * stride_w + cols[None, :]).to(tl.float32)
        s = tl.load(S + bn * stride_s + bk)
        s = _e8m0_to_f32(s.to(tl.int32)) if S_E8M0 else s
        tl.store(OUT + rows[:, None] * stride_o + cols[None, :], (w * s).to(tl.bfloat16))


def dequant_fp8_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """bf16 copy of a 128x128-block FP8 weight in one launch: `dsv4.quant.fp8.dequantize_fp8_block(weight,
    scale, torch.bfloat16)` bit for bit (exact products in fp32, one rounding). Prefill's `wo_a` runs cuBLAS
    on this transient copy; the torch form took four launches, 327 µs for Flash's 32 MB (s12d)."""
    n, k = weight.shape
    if weight.dtype != torch.float8_e4m3fn or n % BLOCK or k % BLOCK or weight.stride(1) != 1:
        raise ValueError(f"dequant_fp8_weight: expected float8_e4m3fn [128 a, 128 b] with unit column stride, "
                         f"got {weight.dtype} {tuple(weight.shape)}")
    if scale.dtype not in _SCALE_DTYPES or tuple(scale.shape) != (n // BLOCK, k // BLOCK) or scale.stride(1) != 1:
        raise ValueError(f"dequant_fp8_weight: scale {scale.dtype} {tuple(scale.shape)} does not fit the weight")
    s_e8m0 = scale.dtype != torch.float32
    sw = scale.view(torch.uint8) if s_e8m0 else scale
    out = torch.empty((n, k), dtype=torch.bfloat16, device=weight.device)
    if n:
        _dequant_kernel[(n // BLOCK, k // BLOCK)](weight, sw, out, weight.stride(0), sw.stride(0), out.stride(0),
                                                  S_E8M0=s_e8m0, num_warps=8)
    return out
