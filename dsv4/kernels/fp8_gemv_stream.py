"""Few-row FP8 block linear as a persistent Gluon kernel with a TMA producer warp: the contract of `fp8_linear_ref`
for 1..MAX_ROWS activation rows (decode). Prepared in session 48, opt-in (`ENABLED`), not yet run on a GPU: the
model does not call it; `bench/runs/run_device_s49d.sh` runs its tests and times it against `fp8_linear`.

Why (docs/kernels_e2e_notes.md, sessions 43 and 48): at one token the decode step's FP8 linears read ≈ 132 MB per
Flash layer in ≈ 58 µs, ≈ 24 µs over their time at copy bandwidth -- the largest per-layer gap left. The decode MoE
GLU showed (`moe_glu_decode`) that a persistent program per SM fed by a producer warp keeps the weight stream going
where many small programs each fill and drain their own pipeline. Here the weights need no widening: the FP8
wgmma takes them from shared memory as stored, so one consumer warpgroup does 4 MMAs and a few FMAs per 8 KB.

    producer (1 warp)       per K block of a unit (64 weight rows, a K range): waits for a free slot, then TMA of
                            the [64, 128] weight bytes (128-byte swizzle) and of the activation codes' [8, 128] box
                            (rows past M arrive as zeros: the TMA's out-of-bounds fill)
    consumer (4 warps)      wgmma m64n8k32 x 4 (A: the weights, B: the activation codes, both e4m3 from shared
                            memory), the slot freed, the [64, 8] block sum scaled by the weight block's scale and
                            each row's activation scale into fp32 registers (the per-128 promotion of the
                            reference's fp32 sums, as `fp8_linear`'s swap-AB GEMM does from two rows); per unit
                            the [64, M] sums stored as the fp32 partial of its K range

`_finish_kernel` sums the S partials in range order and rounds to bf16. The activations are quantised first by
`fp8_linear.act_quant` (the same codes and power-of-two scales as every other path).
"""
from __future__ import annotations

import functools

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET

ENABLED = False  # (not called by the model yet: opt-in once measured)
STAGES = 8  # ring slots of one K block each (8 KB of weights + 1 KB of activation codes)
MAX_ROWS = 8  # activation rows (the MMA's N)
UNITS_PER_PROGRAM = 4  # the K split is chosen so that each program gets about this many units
# the launch's register bound: Triton's default for the 8-warp launch (65536 / 256 = 256) is past ptxas's 255 and
# ignored, and the partitions' setmaxnreg then fault (`moe_glu_decode.ONE_CONSUMER_MAXNREG`, session 47)
MAXNREG = 232

if HAS_TRITON and not INTERPRET:
    import triton
    import triton.language as tl
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from dsv4.kernels._triton import gluon_pdl_wait, pdl_kernel, pdl_wait

    @gluon.jit
    def _unit_count(n_units):
        pid = gl.program_id(0)
        return (n_units - pid + gl.num_programs(0) - 1) // gl.num_programs(0)

    @gluon.jit
    def _producer(w_desc, x_desc, w_s, x_s, ready, free, n_units, KBR, S: gl.constexpr, R: gl.constexpr):
        c = 0  # K blocks issued
        for k in range(_unit_count(n_units)):
            u = gl.program_id(0) + k * gl.num_programs(0)
            tile = u // S
            kb0 = (u % S) * KBR
            for j in range(KBR):
                slot = c % R
                mbarrier.wait(free.index(slot), ((c // R) & 1) ^ 1)  # a fresh barrier passes phase 1
                mbarrier.expect(ready.index(slot), 64 * 128 + 8 * 128)
                tma.async_copy_global_to_shared(w_desc, [tile * 64, (kb0 + j) * 128], ready.index(slot),
                                                w_s.index(slot))
                tma.async_copy_global_to_shared(x_desc, [0, (kb0 + j) * 128], ready.index(slot), x_s.index(slot))
                c += 1

    @gluon.jit
    def _consumer(SX, SW, P, w_s, x_s, ready, free, n_units, KBR, M, N, stride_sx, stride_swn, stride_ps,
                  S: gl.constexpr, R: gl.constexpr, SW_E8M0: gl.constexpr):
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 32])
        op_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        zero = gl.zeros([64, 8], gl.float32, layout=acc_l)
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
        m = gl.arange(0, 8, layout=gl.SliceLayout(0, acc_l))
        c = 0
        for k in range(_unit_count(n_units)):
            u = gl.program_id(0) + k * gl.num_programs(0)
            tile = u // S
            sp = u % S
            acc = zero
            for j in range(KBR):
                slot = c % R
                kb = sp * KBR + j
                # the scales first (global / L1, under the wait): each row's activation scale, the block's weight
                # scale (a 64-row tile lies in one 128-row scale group)
                sx = gl.load(SX + m * stride_sx + kb, mask=m < M, other=0.0)
                if SW_E8M0:
                    b = gl.load(SW + (tile // 2) * stride_swn + kb).to(gl.int32)
                    sw = gl.where(b == 0, 0x00400000, gl.where(b == 255, 0x7FC00000, b << 23)).to(gl.float32,
                                                                                                  bitcast=True)
                else:
                    sw = gl.load(SW + (tile // 2) * stride_swn + kb)
                mbarrier.wait(ready.index(slot), (c // R) & 1)
                w = w_s.index(slot)._reinterpret(gl.float8e4nv, [64, 128], op_l)
                x = x_s.index(slot)._reinterpret(gl.float8e4nv, [8, 128], op_l)
                p = zero
                for q in gl.static_range(4):
                    p = warpgroup_mma(w.slice(32 * q, 32, dim=1), x.slice(32 * q, 32, dim=1).permute((1, 0)), p,
                                      use_acc=q > 0, is_async=True)
                p = warpgroup_mma_wait(num_outstanding=0, deps=[p])
                mbarrier.arrive(free.index(slot), count=1)  # (Triton's barrier before it: every warp's MMA done)
                acc = acc + p * (sx * sw)[None, :]
                c += 1
            dst = P + sp.to(gl.int64) * stride_ps + m[None, :] * N + tile * 64 + r[:, None]
            gl.store(dst, acc, mask=(m < M)[None, :])

    @pdl_kernel
    @gluon.jit
    def _stream_kernel(w_desc, x_desc, SX, SW, P, n_units, KBR, M, N, stride_sx, stride_swn, stride_ps,
                       S: gl.constexpr, R: gl.constexpr, SW_E8M0: gl.constexpr):
        """P[s, m, n] = the fp32 partial of K range s of row m's output n (module docstring)."""
        op_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        w_s = gl.allocate_shared_memory(gl.uint8, [R, 64, 128], op_l)
        x_s = gl.allocate_shared_memory(gl.uint8, [R, 8, 128], op_l)
        ready = gl.allocate_shared_memory(gl.int64, [R, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [R, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(R):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(free.index(i), count=1)
        gluon_pdl_wait()  # (the activation codes come from the kernel just before: act_quant)
        gl.warp_specialize([
            (_consumer, (SX, SW, P, w_s, x_s, ready, free, n_units, KBR, M, N, stride_sx, stride_swn, stride_ps, S,
                         R, SW_E8M0)),
            (_producer, (w_desc, x_desc, w_s, x_s, ready, free, n_units, KBR, S, R)),
        ], [1], [40])

    @pdl_kernel
    @triton.jit
    def _finish_kernel(P, Y, N, stride_ps, stride_y, S: tl.constexpr, BN: tl.constexpr):
        """Y[m, n] = bf16 of the S partials summed in range order from 0.0."""
        pdl_wait()
        m = tl.program_id(0)
        offs = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros((BN,), dtype=tl.float32)
        for s in tl.static_range(S):
            acc += tl.load(P + s * stride_ps + m * N + offs)
        tl.store(Y + m * stride_y + offs, acc.to(tl.bfloat16))

    def _descriptors(weight: torch.Tensor, q: torch.Tensor) -> tuple:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        return (TensorDescriptor.from_tensor(weight.view(torch.uint8), [64, 128], layout),
                TensorDescriptor.from_tensor(q.view(torch.uint8), [8, 128], layout))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_split(n: int, k: int, sms: int) -> int:
    """K ranges per 64-row tile: the fewest that give every SM about UNITS_PER_PROGRAM units, among the divisors of
    the K blocks (at most all of them: one K block per unit)."""
    tiles, kblocks = n // 64, k // 128
    want = max(1, -(-sms * UNITS_PER_PROGRAM // tiles))
    return next((s for s in range(want, kblocks + 1) if kblocks % s == 0), kblocks)


def check(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
    """The shapes this kernel takes (else a ValueError naming the operand)."""
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"fp8_gemv_stream: x must be bf16 [1..{MAX_ROWS}, K], got {x.dtype} {tuple(x.shape)}")
    n, k = weight.shape
    if weight.dtype != torch.float8_e4m3fn or not weight.is_contiguous() or n % 64 or k % 128 or x.shape[1] != k:
        raise ValueError(f"fp8_gemv_stream: weight must be contiguous e4m3 [N % 64 == 0, K % 128 == 0] matching x, "
                         f"got {weight.dtype} {tuple(weight.shape)} for x {tuple(x.shape)}")
    if scale.shape != (-(-n // 128), k // 128) or scale.dtype not in (torch.float8_e8m0fnu, torch.uint8,
                                                                      torch.float32):
        raise ValueError(f"fp8_gemv_stream: scale must be E8M0 or float32 [{-(-n // 128)}, {k // 128}], got "
                         f"{scale.dtype} {tuple(scale.shape)}")


def fp8_gemv_stream(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, stages: int | None = None,
                    split: int | None = None) -> torch.Tensor:
    """y [M, N] bf16 = `fp8_linear_ref(x, weight, scale)` for M <= MAX_ROWS rows (module docstring)."""
    from dsv4.kernels.fp8_linear import act_quant

    check(x, weight, scale)
    m, k = x.shape
    n = weight.shape[0]
    q, sx = act_quant(x)
    sms = _sm_count(x.device.index if x.device.index is not None else torch.cuda.current_device())
    s = pick_split(n, k, sms) if split is None else split
    if (k // 128) % s:
        raise ValueError(f"fp8_gemv_stream: split {s} must divide the {k // 128} K blocks")
    e8m0 = scale.dtype != torch.float32
    sw = scale.view(torch.uint8) if e8m0 else scale
    part = torch.empty((s, m, n), dtype=torch.float32, device=x.device)
    w_desc, x_desc = _descriptors(weight, q)
    n_units = (n // 64) * s
    _stream_kernel[(min(n_units, sms),)](
        w_desc, x_desc, sx, sw, part, n_units, k // 128 // s, m, n, sx.stride(0), sw.stride(0), part.stride(0),
        S=s, R=STAGES if stages is None else stages, SW_E8M0=e8m0, num_warps=4, maxnreg=MAXNREG)
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    bn = 512 if n % 512 == 0 else 64
    _finish_kernel[(m, n // bn)](part, y, n, part.stride(0), y.stride(0), S=s, BN=bn, num_warps=4)
    return y
