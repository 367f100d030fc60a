"""The prefill MoE's GLU on FP8 tensor cores (Gluon): BM tokens x 64 channels (gate and up) per program, the MXFP4
weights re-encoded to e4m3 per 64-row x 128-wide tile on the fly.

Why (docs/kernels_e2e_notes.md, sessions 11, 28, 33): the bf16 GLU (`moe_wide_async`) is bound by its chain of
register-operand MMAs at ≈ 58 % of the bf16 tensor pipe, so #5's 50 % of the FP8 peak is out of its reach;
session 11's `moe_wide_fp8` (removed in session 36) ran FP8 MMAs but spent ≈ 2x the MMA time in instructions:
64-token tiles (the re-encode of each weight served 64 tokens) and a promotion of two multiplies per element (a
scale per weight row).
Here both costs are halved:

    tile          BM = 128 sorted pairs (two warpgroups, one per 64 tokens: the MMA's M) x 128 weight rows (the
                  program's 64 gate rows and its 64 up rows: N), K in 128-wide blocks
    weight scale  one per 64-row x 128-wide tile (`PackedExperts.w13_tile_bmax`): code * 2^(b_g - 127) ==
                  e4m3(e2m1(code) * 2^(6 - d_g)) * 2^(bmax - 133) with d_g = bmax - b_g <= 11 (`fp8_tiles_ok`;
                  the prmt table of `e4m3_reencode._e2m1_e4m3`), so the promotion is one FMA per element:
                  acc += p * (sa[token] * 2^(bmax - 133)) with sa the activation's scale (act_quant, per 128)
    loop          the block's e4m3 weights are written to a 2-slot shared-memory buffer by all eight warps while
                  the previous block's MMAs run; the MMAs read both operands from shared memory (A = the tokens'
                  codes, B = the weights); two partial sums alternate, so a block's promotion overlaps the next
                  block's MMAs; a cp.async ring of STAGES slots brings the codes and the packed weight bytes

The products are the reference's exactly (e4m3 codes times e2m1 values, both scales powers of two); each block's
sum is the FP8 MMA's (as in DeepSeek's own FP8 block GEMMs), so the outputs match `fused_moe_ref` statistically.
z (swiglu clamp, routing weight) is stored unquantised in sorted order; `moe_wide.requant_rows` quantises it per
128 channels for the down GEMM, as after the 64-channel bf16 GLU. The GLU is opt-in (`moe_wide.FP8_GLU`: slower than
the bf16 GLU, s35d); the down GEMM (`moe_wide.FP8_DOWN`) is the default from 96 pairs per expert. The same GEMMs
with the copies and the re-encode on producer warps: `dsv4.kernels.moe_fp8_ws` (`WS_DOWN`, the default; `WS_GLU`).
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON

STAGES = 4  # cp.async ring slots (K blocks); the copies run STAGES - 2 blocks ahead of the re-encode
ROWS = 64  # channels per program (and rows per weight-scale tile)
# the warp-specialized kernel for the GLU / the down GEMM (dsv4.kernels.moe_fp8_ws: producer and consumer warps;
# the same bits). The down GEMM's default since session 41 (4-layer 8K forward, `profile_step.py`: down kernels
# 8,116 -> 7,586 us, forward GPU 43,497 -> 43,235 us); the GLU's not (the FP8 GLU through it: 43,886 us, its GLU
# +6 % on the bf16 one)
WS_GLU = False
WS_DOWN = True
# Measured and removed (session 75, commit ddbb27d): the WS kernels on weights whose nibbles were moved within each
# 32-bit word so that the re-encode takes 7 SASS per word instead of 12 (producer loop 403 -> 323 instructions):
# bit-identical, Flash MoE call (H100, L2 flushed) 8K 5.907 -> 5.822 ms, 16K 11.325 -> 10.934; with the WS FP8 GLU
# too 6.249 -> 6.137 / 11.788 -> 11.005. Not the producers' bound; not worth moving every MoE kernel to that layout

if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from dsv4.kernels.e4m3_reencode import _e2m1_e4m3
    from dsv4.kernels.moe_wide_async import block_rows, launch_order, tile_block

    _R: gl.constexpr = gl.constexpr(ROWS)

    @gluon.jit
    def _code_ptrs(A, SORTED, row0, num_pairs, top_k, stride_am, BM: gl.constexpr, GLU: gl.constexpr,
                   x_l: gl.constexpr):
        """The tile's BM rows of token codes in layout x_l: (pointers [BM, 128] to K block 0, the valid rows' mask)."""
        _, xvalid, rows = block_rows(SORTED, row0, num_pairs, top_k, BM, gl.SliceLayout(1, x_l), GLU)
        xk = gl.arange(0, 128, layout=gl.SliceLayout(0, x_l))
        return A + rows[:, None] * stride_am + xk[None, :], xvalid[:, None] & (xk[None, :] < 128)

    @gluon.jit
    def _weight_ptrs(W, WS, TB, e, pid_n, up_off, stride_we, stride_wn, stride_wse, stride_wsn, stride_tbe, stride_tbn,
                     CH: gl.constexpr, w_l: gl.constexpr, v_l: gl.constexpr):
        """K block 0 of the program's 128 weight rows (GLU: its 64 gate channels, then the same 64 up channels up_off
        rows further; else 128 consecutive output channels): (pointers to their packed bytes [128, 64] in layout w_l,
        (pointers to their scale words, to their tiles' largest bytes) [128] in layout v_l)."""
        wr = gl.arange(0, 2 * _R, layout=gl.SliceLayout(1, w_l))
        wch = pid_n * CH + wr % _R + (wr // _R) * up_off
        wk = gl.arange(0, 64, layout=gl.SliceLayout(0, w_l))
        w_ptrs = W + e * stride_we + wch[:, None].to(gl.int64) * stride_wn + wk[None, :]
        vr = gl.arange(0, 2 * _R, layout=v_l)
        vch = pid_n * CH + vr % _R + (vr // _R) * up_off  # (32-bit offsets from scalar bases: fewer registers)
        return w_ptrs, ((WS + e * stride_wse) + vch * stride_wsn, (TB + e * stride_tbe) + (vch // _R) * stride_tbn)

    @gluon.jit
    def _copy_weights(w_s, v_s, w_ptrs, v_ptrs, kb, slot):
        """cp.async of K block kb's weights into ring slot `slot`: the 128 weight rows' packed bytes [128, 64], their
        scale words [128] and their tiles' largest bytes [128] (v_s's two rings)."""
        async_copy.async_copy_global_to_shared(w_s.index(slot), w_ptrs + kb * 64)
        async_copy.async_copy_global_to_shared(v_s[0].index(slot), v_ptrs[0] + kb)
        async_copy.async_copy_global_to_shared(v_s[1].index(slot), v_ptrs[1] + kb)

    @gluon.jit
    def _issue(x_s, w_s, v_s, x_ptrs, x_mask, w_ptrs, v_ptrs, kb, nblocks, STAGES: gl.constexpr):
        """cp.async of K block kb (the tokens' codes [BM, 128] and `_copy_weights`) into ring slot kb % STAGES; one
        commit group (empty past the end)."""
        if kb < nblocks:
            slot = kb % STAGES
            async_copy.async_copy_global_to_shared(x_s.index(slot), x_ptrs + kb * 128, mask=x_mask)
            _copy_weights(w_s, v_s, w_ptrs, v_ptrs, kb, slot)
        async_copy.commit_group()

    @gluon.jit
    def _reencode(w_s, v_s, slot, c_l: gl.constexpr):
        """The e4m3 weights of ring slot `slot`'s packed bytes, per 32-wide group: four [128, 32] tensors in layout
        c_l (sc: the rows' scale words, bt: their tiles' largest byte)."""
        sc = v_s[0].index(slot).load(gl.SliceLayout(1, c_l))
        bt = v_s[1].index(slot).load(gl.SliceLayout(1, c_l))
        # half h: low nibbles k 64h..64h+31 (group 2h), high ones the next 32
        lo0, hi0 = _e2m1_e4m3(w_s.index(slot).slice(0, 32, dim=1).load(c_l), bt - (sc & 0xFF), bt - ((sc >> 8) & 0xFF))
        lo1, hi1 = _e2m1_e4m3(w_s.index(slot).slice(32, 32, dim=1).load(c_l), bt - ((sc >> 16) & 0xFF),
                              bt - ((sc >> 24) & 0xFF))
        return lo0, hi0, lo1, hi1

    @gluon.jit
    def _stage(x_s, w_s, v_s, wq, x_ptrs, x_mask, w_ptrs, v_ptrs, kb, nblocks, c_l: gl.constexpr,
               STAGES: gl.constexpr):
        """Block kb: wait for its copies (every warp's), re-encode its weights into the weight slot wq (four
        [128, 32] buffers, one per 32-wide group; sc: the rows' scale words, bt: their tiles' largest byte), fence
        them for the tensor cores, then refill the ring STAGES - 2 blocks ahead (the slot of block kb - 2, whose
        MMAs every warp has waited for). The refill comes after the last barrier so that no barrier separates it
        from the re-encode's reads of the ring, and each group has its own buffer, because Triton's barrier
        analysis takes accesses to one allocation for overlapping ones."""
        async_copy.wait_group(STAGES - 3)
        gl.thread_barrier()
        lo0, hi0, lo1, hi1 = _reencode(w_s, v_s, kb % STAGES, c_l)
        wq[0].store(lo0)
        wq[1].store(hi0)
        wq[2].store(lo1)
        wq[3].store(hi1)
        fence_async_shared()
        gl.thread_barrier()
        _issue(x_s, w_s, v_s, x_ptrs, x_mask, w_ptrs, v_ptrs, kb + STAGES - 2, nblocks, STAGES)

    @gluon.jit
    def _mma(x_s, wq, kb, p, STAGES: gl.constexpr):
        """Block kb's FP8 MMAs [BM, 128 k] x [128 k, 128 rows] (four k32 wgmmas, one per group buffer of wq),
        issued asynchronously into p's registers (a promoted partial sum, which the first one's use_acc=False
        ignores)."""
        x = x_s.index(kb % STAGES)
        for j in gl.static_range(4):
            p = warpgroup_mma(x.slice(32 * j, 32, dim=1), wq[j].permute((1, 0)), p, use_acc=j > 0, is_async=True)
        return p

    @gluon.jit
    def _promote(acc, p, sa, bg, bu):
        """acc [BM, 2, 64] (gate, up) += p [BM, 128] * sa[token] * 2^(b - 133) with b the gate or up tile's
        largest scale byte: one FMA per element."""
        half = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, acc.type.layout)))
        return _promote_tiles(acc, p, sa, gl.where(half == 0, bg, bu))

    @gluon.jit
    def _promote_tiles(acc, p, sa, tb):
        """`_promote` with the two tiles' largest bytes as one [2] tensor in the slice layout of acc's middle axis."""
        BM: gl.constexpr = p.shape[0]
        p3 = gl.reshape(p, [BM, 2, _R])
        c_l: gl.constexpr = gl.SliceLayout(2, p3.type.layout)
        sw = ((tb - 6) << 23).to(gl.float32, bitcast=True)
        c = gl.convert_layout(sa, gl.SliceLayout(1, c_l))[:, None] * sw[None, :]
        return acc + p3 * c[:, :, None]

    @gluon.jit
    def _epilogue(acc, C, SORTED, TOPK_W, num_pairs, row0, pid_n, limit, stride_cm, CH: gl.constexpr,
                  GLU: gl.constexpr):
        """The output of acc [BM, 2, 64] (BM sorted rows from row0; gate and up, or 128 output channels)."""
        BM: gl.constexpr = acc.shape[0]
        NW: gl.constexpr = gl.num_warps()
        if GLU:  # gate and up rounded to bf16, clamped, silu(gate) * up times the pair's routing weight, z stored
            # in sorted order (16 bytes per thread)
            gate, up = gl.split(gl.permute(acc, [0, 2, 1]))
            gate = gl.minimum(gate.to(gl.bfloat16).to(gl.float32), limit)
            up = gl.minimum(gl.maximum(up.to(gl.bfloat16).to(gl.float32), -limit), limit)
            cp = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, gate.type.layout))
            pair = gl.load(SORTED + cp)
            rw = gl.load(TOPK_W + pair, mask=pair < num_pairs, other=0.0)
            z = ((gate / (1.0 + gl.exp(-gate)) * up) * rw[:, None]).to(gl.bfloat16)
            out_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
            z = gl.convert_layout(z, out_l)
            om = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, out_l))
            oc = pid_n * CH + gl.arange(0, CH, layout=gl.SliceLayout(0, out_l))
            gl.store(C + om.to(gl.int64)[:, None] * stride_cm + oc[None, :], z)
        else:  # bf16 rows of y per (token, slot); other ranks' pairs and padding left unwritten
            out_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NW, 1], [1, 0])
            y = gl.convert_layout(gl.reshape(acc, [BM, CH]).to(gl.bfloat16), out_l)
            pair = gl.load(SORTED + row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, out_l)))
            oc = pid_n * CH + gl.arange(0, CH, layout=gl.SliceLayout(0, out_l))
            gl.store(C + pair.to(gl.int64)[:, None] * stride_cm + oc[None, :], y,
                     mask=(pair < num_pairs)[:, None] & (oc >= 0)[None, :])

    @gluon.jit
    def _glu_fp8_kernel(
        A, AS, W, WS, TB, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W, TILES,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_tbe, stride_tbn, stride_cm,
        BM: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, LISTED: gl.constexpr, GLU: gl.constexpr,
    ):
        # GLU: the program's 128 weight rows are its 64 gate channels and the same 64 up channels (up_off rows
        # further); else (the down GEMM) 128 consecutive output channels (up_off = 64). Either way two 64-row
        # scale tiles, up_off rows apart
        CH: gl.constexpr = _R if GLU else 2 * _R
        NW: gl.constexpr = gl.num_warps()
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, 2 * _R, 32])
        pid_m, pid_n = launch_order(GROUP_M)
        blk, row0, live = tile_block(TILES, NUM_POST, pid_m, BM, LISTED)
        if not live:
            return
        e = gl.load(EXPERT_IDS + blk).to(gl.int64)

        # the tokens' codes (16 bytes per thread) and, in the accumulator's rows, their scales
        x_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NW, 1], [1, 0])
        x_ptrs, x_mask = _code_ptrs(A, SORTED, row0, num_pairs, top_k, stride_am, BM, GLU, x_l)
        _, _, srows = block_rows(SORTED, row0, num_pairs, top_k, BM, gl.SliceLayout(1, acc_l), GLU)
        sa_ptrs = AS + srows * stride_asm

        # weight rows: the program's 64 gate channels, then the same 64 up channels (packed bytes 16 per thread; the
        # re-encode layout c_l: one row per two threads)
        w_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])
        c_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [NW, 1], [1, 0])
        # ... their scale words and their tiles' largest bytes (a word each), the re-encode's inputs, come through
        # the ring as well: loaded a block ahead they still stalled it (s35c: long scoreboard)
        v_l: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        w_ptrs, v_ptrs = _weight_ptrs(W, WS, TB, e, pid_n, up_off, stride_we, stride_wn, stride_wse, stride_wsn,
                                      stride_tbe, stride_tbn, CH, w_l, v_l)
        tb_g = TB + e * stride_tbe + (pid_n * CH // _R) * stride_tbn
        tb_u = tb_g + (up_off // _R) * stride_tbn

        x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        x_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, 128], x_sl)
        # the packed bytes: 64-byte rows, whose 32-byte halves swap every other pair of rows, so that the re-encode's
        # 16-byte reads (a quarter warp: four rows' same half) meet no bank twice
        w_s = gl.allocate_shared_memory(gl.uint8, [STAGES, 2 * _R, 64], gl.SwizzledSharedLayout(32, 2, 2, order=[1, 0]))
        v_s = (gl.allocate_shared_memory(gl.int32, [STAGES, 2 * _R], gl.SwizzledSharedLayout(1, 1, 1, order=[0])),
               gl.allocate_shared_memory(gl.int32, [STAGES, 2 * _R], gl.SwizzledSharedLayout(1, 1, 1, order=[0])))
        g_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
        wq0 = (gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl),
               gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl),
               gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl),
               gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl))
        wq1 = (gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl),
               gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl),
               gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl),
               gl.allocate_shared_memory(gl.float8e4nv, [2 * _R, 32], g_sl))

        nblocks = K // 128
        for s in gl.static_range(STAGES - 2):
            _issue(x_s, w_s, v_s, x_ptrs, x_mask, w_ptrs, v_ptrs, s, nblocks, STAGES)
        # block 0 into weight slot 0 and its MMAs in flight; then pairs of blocks: 2t + 1 (slot 1) re-encoded while
        # 2t runs, 2t + 2 (slot 0) while 2t + 1 runs; a block is promoted while the next one's MMAs run. The scales
        # of a block are loaded when it is re-encoded and carried to its promotion
        bg_a = gl.load(tb_g)
        bu_a = gl.load(tb_u)
        sa_a = gl.load(sa_ptrs)
        _stage(x_s, w_s, v_s, wq0, x_ptrs, x_mask, w_ptrs, v_ptrs, 0, nblocks, c_l, STAGES)
        zero = gl.zeros([BM, 2 * _R], gl.float32, layout=acc_l)
        pa = _mma(x_s, wq0, 0, zero, STAGES)
        pb = zero
        acc = gl.reshape(zero, [BM, 2, _R])
        for t in range((nblocks + 1) // 2):
            b1 = gl.minimum(2 * t + 1, nblocks - 1)  # (odd counts: the last pair repeats the last block)
            bg_b = gl.load(tb_g + b1)
            bu_b = gl.load(tb_u + b1)
            sa_b = gl.load(sa_ptrs + b1)
            _stage(x_s, w_s, v_s, wq1, x_ptrs, x_mask, w_ptrs, v_ptrs, b1, nblocks, c_l, STAGES)
            pa = warpgroup_mma_wait(num_outstanding=0, deps=[pa])
            pb = _mma(x_s, wq1, b1, pb, STAGES)
            acc = _promote(acc, pa, sa_a, bg_a, bu_a)
            b2 = gl.minimum(2 * t + 2, nblocks - 1)
            bg_a = gl.load(tb_g + b2)
            bu_a = gl.load(tb_u + b2)
            sa_a = gl.load(sa_ptrs + b2)
            _stage(x_s, w_s, v_s, wq0, x_ptrs, x_mask, w_ptrs, v_ptrs, b2, nblocks, c_l, STAGES)
            pb = warpgroup_mma_wait(num_outstanding=0, deps=[pb])
            pa = _mma(x_s, wq0, b2, pa, STAGES)
            if 2 * t + 1 < nblocks:
                acc = _promote(acc, pb, sa_b, bg_b, bu_b)
        pa = warpgroup_mma_wait(num_outstanding=0, deps=[pa])  # the repeat of the last block: not promoted
        async_copy.wait_group(0)

        _epilogue(acc, C, SORTED, TOPK_W, num_pairs, row0, pid_n, limit, stride_cm, CH, GLU)


def launch(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, sw: torch.Tensor, tile_bmax: torch.Tensor,
           out: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, num_post: torch.Tensor,
           topk_w: torch.Tensor, top_k: int, limit: float, rows: int, bm: int, glu: bool, group_m: int = 0, tiles=None):
    """glu: the GLU from act_quant's codes xq [M, D] and scales xs [M, D / 128] of the tokens into z [nb * 64, I] bf16
    (sorted order, unquantised); else the down GEMM from z's codes and scales (sorted order) into y [pairs, D] bf16.
    w / sw / tile_bmax: `PackedExperts`' w13 or w2 (`fp8_tiles_ok`); rows programs along M (tiles: int32 [rows],
    program i's tile starts at 64-row block tiles[i] of a 64-row alignment, -1 none; else block i of a bm-row
    alignment); bm 64 (one warpgroup) or 128 (two). Returns the compiled kernel."""
    if bm not in (64, 128):
        raise ValueError(f"moe_glu_fp8: bm must be 64 or 128, got {bm}")
    n = w.shape[1] // 2 if glu else w.shape[1]
    listed = tiles is not None
    grid = (rows, n // (ROWS if glu else 2 * ROWS))
    args = (xq, xs, w, sw, tile_bmax, out, sorted_ids, expert_ids, num_post, topk_w, tiles if listed else expert_ids,
            xq.shape[1], topk_w.numel(), top_k, n if glu else ROWS, float(limit),
            xq.stride(0), xs.stride(0), w.stride(0), w.stride(1), sw.stride(0), sw.stride(1), tile_bmax.stride(0),
            tile_bmax.stride(1), out.stride(0))
    if WS_GLU if glu else WS_DOWN:
        from dsv4.kernels.moe_fp8_ws import launch_ws

        return launch_ws(args, grid, bm, group_m, listed, glu)
    return _glu_fp8_kernel[grid](*args, BM=bm, STAGES=STAGES, GROUP_M=group_m, LISTED=listed, GLU=glu,
                                 num_warps=bm // 16)
