"""`moe_wide`'s two grouped GEMMs with the weight widening overlapped with the tensor cores (Gluon).

Why: in `dsv4.kernels.moe_wide` the same warps widen a 32-wide weight group (CUDA cores) and then issue its
wgmma; Triton's `tl.dot` waits for every wgmma whose A operand comes from registers (`wgmma.wait_group 0`
right after each one), so widening and MMA take turns (docs/benchmarks.md #5, session 9). Here the loop is
written out in Gluon (`triton.experimental.gluon`, explicit layouts and asynchronous wgmma):

    issue wgmma(group g) asynchronously         tensor cores
    widen group g + 1 into registers            CUDA cores, while the MMA runs
    wait for wgmma(g) (keeping its registers)   then the next step

(`_reg_a_loop`: the weights stay the MMA's register operand, one step in flight -- ptxas serialises an MMA
whose register operand is defined while an earlier MMA is in flight), or, with `a_smem`, the widened group
goes to a 2-slot shared-memory ring and the MMA reads it there, so one step stays in flight while the next
group is widened and the tensor cores always have the next MMA queued (`_smem_a_loop`).

The values are `moe_wide`'s exactly (the same f16 widening, 2^(b - 113) scale, bf16 operands, one fp32
chain over K; the GLU epilogue quantises z per token and 128 channels and stores it dequantised), so the
results equal `moe_wide`'s up to the MMA's summation order. The activation tiles stream through a ring of
STAGES shared-memory buffers by cp.async; the weights are loaded straight in the wgmma A-operand layout.

Status: prepared in session 9 after its device time was spent -- compiled for sm_90a (ptxas: no spills, no
wgmma serialisation warning; 235 registers and 24 KB / 237 and 56 KB of shared memory for the GLU at 128-row
tiles), not yet run on a GPU. Opt-in (`moe_wide.ASYNC`, `ASYNC_A_SMEM`, `ASYNC_STAGES`);
`bench/runs/run_device_s10a.sh` runs its tests and the A/B.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from dsv4.kernels.fp8_linear import _pow2_scale
    from dsv4.kernels.moe_gemv import _f16_hi, _f16_lo
    from dsv4.kernels.moe_wide import _scale

    @gluon.jit
    def _widen_group(w_ptrs, s_ptrs, g):
        """bf16 [BN, 32] weights of 32-wide K group g (`moe_wide._widen` with F16): the packed bytes of its
        half block (low nibbles: even groups, high: odd), times 2^(b - 113) of the row's scale byte."""
        kb = g // 4
        sub = g % 4
        wb = gl.load(w_ptrs + kb * 64 + (sub // 2) * 32)
        scale = _scale(gl.load(s_ptrs + kb), sub, True)
        if sub % 2 == 0:
            w = _f16_lo(wb, True)
        else:
            w = _f16_hi(wb, True)
        return (w.to(gl.float32) * scale[:, None]).to(gl.bfloat16)

    @gluon.jit
    def _reg_a_loop(acc, acc_u, x_s, x_ptrs, x_mask, w_ptrs, s_ptrs, u_ptrs, su_ptrs, ngroups, GLU: gl.constexpr,
                    STAGES: gl.constexpr):
        """Weights as the wgmma's register operand: step g issues its MMAs, widens group g + 1 while they run,
        then waits for them (ptxas requires a register operand to be defined before its MMA's stage)."""
        for s in gl.static_range(STAGES - 1):
            async_copy.async_copy_global_to_shared(x_s.index(s), x_ptrs + s * 32, mask=x_mask)
            async_copy.commit_group()
        w = _widen_group(w_ptrs, s_ptrs, 0)
        w_u = w
        if GLU:
            w_u = _widen_group(u_ptrs, su_ptrs, 0)
        for g in range(ngroups):
            nxt = g + STAGES - 1
            if nxt < ngroups:  # its ring slot was read by wgmma(g - 1), which has completed
                async_copy.async_copy_global_to_shared(x_s.index(nxt % STAGES), x_ptrs + nxt * 32, mask=x_mask)
            async_copy.commit_group()
            async_copy.wait_group(STAGES - 1)
            fence_async_shared()
            xt = x_s.index(g % STAGES).permute((1, 0))
            tok = warpgroup_mma(w, xt, acc, is_async=True)
            if GLU:
                tok_u = warpgroup_mma(w_u, xt, acc_u, is_async=True)
            # the next group's widening runs while the MMAs do (the last step widens one group twice)
            g1 = gl.minimum(g + 1, ngroups - 1)
            w_next = _widen_group(w_ptrs, s_ptrs, g1)
            if GLU:
                w_u_next = _widen_group(u_ptrs, su_ptrs, g1)
                acc, acc_u, w, w_u = warpgroup_mma_wait(num_outstanding=0, deps=[tok, tok_u, w, w_u])
                w_u = w_u_next
            else:
                acc, w = warpgroup_mma_wait(num_outstanding=0, deps=[tok, w])
            w = w_next

        return acc, acc_u

    @gluon.jit
    def _smem_a_loop(acc, acc_u, x_s, x_ptrs, x_mask, W, WS, pid_n, stride_wn, stride_wsn, up_off, ngroups,
                     BM: gl.constexpr, BN: gl.constexpr, GLU: gl.constexpr, NW: gl.constexpr, STAGES: gl.constexpr):
        """Weights widened into a 2-slot shared-memory ring and read by the wgmma from there: step g widens
        group g while step g - 1's MMAs still run (one step left in flight), so the tensor cores always have
        the next MMA queued. The weight bytes load 16 per thread (coalesced)."""
        w_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[16, 2], warps_per_cta=[NW, 1],
                                             order=[1, 0])
        w_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        wn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, w_l))
        wk = gl.arange(0, 32, layout=gl.SliceLayout(0, w_l))
        w_ptrs = W + wn[:, None].to(gl.int64) * stride_wn + wk[None, :]
        s_ptrs = WS + wn.to(gl.int64) * stride_wsn
        u_ptrs = w_ptrs + up_off * stride_wn
        su_ptrs = s_ptrs + up_off * stride_wsn
        w_s = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 32], w_sl)
        wu_s = gl.allocate_shared_memory(gl.bfloat16, [2, BN, 32], w_sl)
        AHEAD: gl.constexpr = STAGES - 2  # the x slot refilled at step g was read by step g - 2's MMAs
        for s in gl.static_range(AHEAD):
            async_copy.async_copy_global_to_shared(x_s.index(s), x_ptrs + s * 32, mask=x_mask)
            async_copy.commit_group()
        for g in range(ngroups):
            nxt = g + AHEAD
            if nxt < ngroups:
                async_copy.async_copy_global_to_shared(x_s.index(nxt % STAGES), x_ptrs + nxt * 32, mask=x_mask)
            async_copy.commit_group()
            w_s.index(g % 2).store(_widen_group(w_ptrs, s_ptrs, g))  # slot last read by step g - 2's MMA
            if GLU:
                wu_s.index(g % 2).store(_widen_group(u_ptrs, su_ptrs, g))
            async_copy.wait_group(AHEAD)
            fence_async_shared()
            xt = x_s.index(g % STAGES).permute((1, 0))
            acc = warpgroup_mma(w_s.index(g % 2), xt, acc, is_async=True)
            if GLU:
                acc_u = warpgroup_mma(wu_s.index(g % 2), xt, acc_u, is_async=True)
                acc, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=[acc, acc_u])
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_u])
        return acc, acc_u

    @gluon.jit
    def _wide_async_kernel(
        A, W, WS, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
        BM: gl.constexpr, BN: gl.constexpr, GLU: gl.constexpr, NW: gl.constexpr, STAGES: gl.constexpr,
        A_SMEM: gl.constexpr,
    ):
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        x_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[8, 4], warps_per_cta=[NW, 1],
                                             order=[1, 0])
        x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        pid_m = gl.program_id(0)
        pid_n = gl.program_id(1)
        if pid_m * BM >= gl.load(NUM_POST):
            return
        e = gl.load(EXPERT_IDS + pid_m).to(gl.int64)

        # activation rows of the block (GLU: the pairs' tokens; GEMM2: z in sorted order), 32 columns per group
        xp = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, x_l))
        xpair = gl.load(SORTED + xp)
        xvalid = xpair < num_pairs
        if GLU:
            rows = gl.where(xvalid, xpair // top_k, 0).to(gl.int64)
        else:
            rows = xp.to(gl.int64)
        xk = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
        x_ptrs = A + rows[:, None] * stride_am + xk[None, :]
        x_mask = xvalid[:, None] & (xk[None, :] < 32)
        x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, 32], x_sl)

        # weight rows of this program, loaded in the wgmma A-operand layout
        wn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, a_l))
        wk = gl.arange(0, 32, layout=gl.SliceLayout(0, a_l))
        w_ptrs = W + e * stride_we + wn[:, None].to(gl.int64) * stride_wn + wk[None, :]
        s_ptrs = WS + e * stride_wse + wn.to(gl.int64) * stride_wsn
        u_ptrs = w_ptrs + up_off * stride_wn
        su_ptrs = s_ptrs + up_off * stride_wsn

        acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        acc_u = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        ngroups = K // 32
        if A_SMEM:
            acc, acc_u = _smem_a_loop(acc, acc_u, x_s, x_ptrs, x_mask, W + e * stride_we, WS + e * stride_wse,
                                      pid_n, stride_wn, stride_wsn, up_off, ngroups, BM, BN, GLU, NW, STAGES)
        else:
            acc, acc_u = _reg_a_loop(acc, acc_u, x_s, x_ptrs, x_mask, w_ptrs, s_ptrs, u_ptrs, su_ptrs, ngroups,
                                     GLU, STAGES)

        # epilogue in the accumulator layout: [BN channels, BM pairs]
        cp = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l))
        cpair = gl.load(SORTED + cp)
        cvalid = cpair < num_pairs
        cn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l))
        if GLU:
            gate = gl.minimum(acc.to(gl.bfloat16).to(gl.float32), limit)
            up = gl.minimum(gl.maximum(acc_u.to(gl.bfloat16).to(gl.float32), -limit), limit)
            rw = gl.load(TOPK_W + cpair, mask=cvalid, other=0.0)
            z = ((gate / (1.0 + gl.exp(-gate)) * up) * rw[None, :]).to(gl.bfloat16).to(gl.float32)
            # W2's input quantisation (act_quant): per pair, over these 128 channels (BN == 128)
            s, inv = _pow2_scale(gl.maximum(gl.max(gl.abs(z), axis=0), 1e-4))
            q = gl.minimum(gl.maximum(z * inv[None, :], -448.0), 448.0).to(gl.float8e4nv)
            zq = (q.to(gl.float32) * s[None, :]).to(gl.bfloat16)  # exact
            gl.store(C + cp.to(gl.int64)[None, :] * stride_cm + cn[:, None], zq)
        else:
            c_ptrs = C + cpair.to(gl.int64)[None, :] * stride_cm + cn[:, None]
            gl.store(c_ptrs, acc.to(gl.bfloat16), mask=cvalid[None, :] & (cn[:, None] >= 0))


def launch(kernel_args: tuple, grid: tuple, bm: int, bn: int, glu: bool, num_warps: int, stages: int,
           a_smem: bool = False) -> None:
    """`_wide_async_kernel[grid](*kernel_args)` with the layout constants (the argument order of
    `moe_wide._wide_kernel` up to its constexprs). a_smem: the weights through shared memory (needs stages >= 3)."""
    if stages < (3 if a_smem else 2):
        raise ValueError(f"moe_wide_async: stages {stages} too few (a_smem={a_smem})")
    _wide_async_kernel[grid](*kernel_args, BM=bm, BN=bn, GLU=glu, NW=num_warps, STAGES=stages, A_SMEM=a_smem,
                             num_warps=num_warps)
