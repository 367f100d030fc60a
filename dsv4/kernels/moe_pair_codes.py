"""The one-warpgroup bf16 GLU's epilogue when it stores the FP8 down GEMM's input codes (`moe_wide.GLU_CODES`):
the two programs of a 128-channel block (64 channels each) finish it by last arrival.

Why: the down GEMM's input is z quantised per row and 128 channels (act_quant). A GLU program of 64 channels holds
half of a block, so it stored bf16 z and act_quant read it all back and wrote the codes: at 8K tokens ≈ 200 MB
written, read, and 100 MB written again (≈ 2 % of the H100's MoE call by bytes). Here, per tile of BM sorted rows:

    first to arrive   stores its bf16 half where the block's 128 code bytes of each row will go (64 bf16 fill
                      them exactly) and each row's largest |z| where the block's scale will go, then releases
    last to arrive    waits for that release (the first is resident: it has arrived), reads the half and the
                      maxima back from L2, and writes both halves' e4m3 codes and the scale over them

So z never reaches memory in bf16 beyond L2 (the staged lines are overwritten by the codes), and the codes and
scales are act_quant's on the same bf16 values: the same bytes. The counter (`arrival_counters`: zero before the
launch) goes 0 -> 1 at the first arrival, -> 2 at the last, +2 at the first's release; the last finds 1 or 3 and
polls while below 3, then leaves it zero for the next launch or graph replay.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from dsv4.kernels.fp8_linear import _pow2_scale

    @gluon.jit
    def e4m3_codes(zf, inv):
        """act_quant's e4m3 codes of fp32 z [channels, BM] with the rows' 1 / scale [BM]."""
        return gl.minimum(gl.maximum(zf * inv[None, :], -448.0), 448.0).to(gl.float8e4nv)

    @gluon.jit
    def store_pair_codes(z, C, ZS, CNT, row0, blk, pid_n, stride_cm, stride_zs, out_l: gl.constexpr,
                         BM: gl.constexpr):
        """z: bf16 [64 channels, BM sorted rows] in out_l, channels pid_n * 64.., rows row0.. of 64-row block blk;
        C: e4m3 codes [rows, I] (unit channel stride, stride_cm even), ZS: fp32 scales [rows, I / 128], CNT: int32
        counters [blocks x I / 128]."""
        j = pid_n // 2
        cp = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, out_l))
        c = gl.arange(0, 64, layout=gl.SliceLayout(1, out_l))[:, None]
        span = C + cp.to(gl.int64)[None, :] * stride_cm + j * 128  # the block's 128 code bytes of each row
        staged = span.to(gl.pointer_type(gl.bfloat16)) + c
        zs_ptrs = ZS + cp.to(gl.int64) * stride_zs + j
        zf = z.to(gl.float32)
        amax = gl.max(gl.abs(zf), axis=0)
        cnt = CNT + blk * (gl.num_programs(1) // 2) + j
        arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == 0:
            gl.store(staged, z)
            gl.store(zs_ptrs, amax)
            gl.thread_barrier()  # every thread's stores before the release
            gl.atomic_add(cnt, 2, sem="release", scope="gpu")
        else:
            while arrived < 3:
                arrived = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
            gl.thread_barrier()  # the loads after the acquire; past the non-coherent L1 (.cg)
            other = gl.load(staged, cache_modifier=".cg").to(gl.float32)
            amax = gl.maximum(gl.maximum(amax, gl.load(zs_ptrs, cache_modifier=".cg")), 1e-4)
            s, inv = _pow2_scale(amax)
            gl.thread_barrier()  # every staged value read before the codes overwrite them
            own = (pid_n % 2) * 64
            gl.store(span + own + c, e4m3_codes(zf, inv))
            gl.store(span + (64 - own) + c, e4m3_codes(other, inv))
            gl.store(zs_ptrs, s)
            gl.store(cnt, 0)
