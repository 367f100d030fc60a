"""Routed MXFP4 MoE for decode-sized batches: one program per (token, slot) pair and tile of output
rows, no token->expert alignment; group sums on CUDA cores (method "cuda", dsv4.kernels.moe_gemv_cuda) or
tensor cores ("mma", here).

Same contract and numerics as `dsv4.kernels.moe.fused_moe` (W4A8: activations quantised per row and
128 channels to e4m3, each 32-wide weight group's products summed in fp32 and scaled by the group
scale and the activation scale; SwiGLU clamp, routing weight, z rounded to bf16 and re-quantised for
W2; one bf16 row per pair; fp32 combine). Only the summation order differs: with method "cuda" a
group's 32 products are summed by a reduction tree on CUDA cores instead of inside an MMA.

Why: with one or two tokens per expert (decode, B <= 8 on Flash), the MMA path computes 16-row tiles
for one valid row and converts every weight tile to f16 for mma.sync; method "cuda" costs one
e4m3 -> f32 conversion and one FMA per weight element, and each program streams its own rows.

method "mma": the same grid, but each 32-wide group is summed by a tensor-core MMA with f16 operands
(exact: e2m1 code c with sign s is the f16 with bits (s << 15) | (c << 9), i.e. e2m1 * 2^-14, the
subnormal 0.5 included; e4m3 -> f16 is exact; the products are exact in the fp32 accumulator). The
weight rows are the MMA's M side ("swap AB", wgmma with the converted weights as its register
operand); the N = 16 side holds the pair's activations block-diagonally: the 32 values of group g of
K block u of a loop step sit in column 4u + g, zeros elsewhere, so each column of the [BN, 16] result
is one group's exact partial sum, scaled by its group scale and the activation block scale and added
to an fp32 accumulator column (the W4A8 math of `moe._fp4_mma`; the 16 columns are summed once at the
end: another summation order of the same fp32 terms). The K order inside the MMA is permuted so that
each thread converts 8 contiguous weight bytes (`_mma_order`); the activations are stored in that
order as f16 copies of their e4m3 codes (`_act_pos`), and Triton pipelines the weight and
activation loads (cp.async, `num_stages`).

Split-K of method "mma" (`split` / `split_down` > 1, opt-in; 1 = one program per row tile, as above): the
loop steps of K are cut into S balanced ranges, one program each (grid axis 2). A program sums its range
exactly as above, adds up its 16 columns, stores the fp32 [BN] partial (gate and up, or y) to a workspace
and bumps the tile's arrival counter; the last to arrive sums the S partials in split order 0..S-1 from 0.0
(the same bits whichever program arrives last), runs the epilogue and resets the counter to 0 for the next
launch / CUDA-graph replay (`dsv4.kernels._triton.arrival_counters`, ordering as in
`dsv4.kernels.grouped_w8a16`). Numerics: again the same exact fp32 terms, summed per K range first.
Pairs of other ranks are skipped by all S programs of a tile before the counter (their counters stay 0).
Why: at decode a GLU program streams 2 x 64 rows x 4096 weights with a few loads in flight; more, shorter
programs per SM keep more of the weight stream in flight.

Blocks of pairs (`pairs_per_program` 2 or 4, dsv4.kernels.moe_gemv_pairs; the default from B ~ 8 to 128 on
Flash): a program serves several pairs of one expert, each in its own 4U of the MMA's activation columns, for
one weight stream; same bits per pair.

Launch fusions of the z / x quantisation and the combine into the GLU / down kernels were measured slower or
neutral and removed (docs/benchmarks.md, session 15).
"""

from __future__ import annotations

import os

import torch

from dsv4.kernels import moe_glu_decode
from dsv4.kernels._triton import HAS_TRITON, arrival_counters
from dsv4.kernels._triton import pdl_kernel, pdl_wait, prefetch_l2
from dsv4.kernels.moe_gemv_pairs import MAX_PAIRS, PAIRS_PER_PROGRAM, pair_blocks
from dsv4.kernels.moe_layout import BLOCK, PackedExperts, check_packed
from dsv4.kernels.moe_mma_operands import check_x_quant


if HAS_TRITON:
    import triton
    import triton.language as tl

    from dsv4.kernels.moe_gemv_pairs import (_act_scales_g, _act_tiles_g, _block_first, _block_member,
                                             _column_pairs, _pair_sum)
    from dsv4.kernels.moe_mma_operands import (_act_scales, _act_tiles, _f16_hi, _f16_lo, _glu_out, _mma_order,
                                                  _scale_acc, quant16_block)

if HAS_TRITON:  # ------------------------------------------------------------- method="mma"

    @triton.jit
    def _k_range(K, U: tl.constexpr, SPLIT: tl.constexpr):
        """First and end K block of this program: all of K, or (SPLIT) range pid_k = program_id(2) of the
        S = num_programs(2) balanced ranges of whole loop steps (U blocks each)."""
        if SPLIT:
            steps = K // 128 // U
            split = tl.num_programs(2)
            pid_k = tl.program_id(2)
            return pid_k * steps // split * U, (pid_k + 1) * steps // split * U
        else:
            return 0, K // 128

    @triton.jit
    def _arrive(CNT, tile):
        """Split-K hand-off after this program stored its fp32 partial(s): bump the tile's counter; True in
        the last arriver only. The CTA barrier puts every thread's partial stores before the one thread's
        gpu-scope acq_rel atomic (a cumulative release); in the last arriver, the atomic's acquire and a
        second barrier put the partial loads (.cg, `_split_sum`) after every other split's release."""
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + tile, 1, sem="acq_rel", scope="gpu")
        last = arrived == tl.num_programs(2) - 1  # uniform over the CTA: the atomic's result is broadcast
        if last:
            tl.debug_barrier()
        return last

    @triton.jit
    def _split_sum(P, stride_ps, BN: tl.constexpr):
        """Sum of the S partials at P, P + stride_ps, ..: split order from 0.0 (arrival-order independent)."""
        total = tl.zeros((BN,), dtype=tl.float32)
        for _ in range(0, tl.num_programs(2)):
            total += tl.load(P, cache_modifier=".cg")
            P += stride_ps  # 64-bit pointer steps
        return total

    @pdl_kernel
    @triton.jit(do_not_specialize=["top_k", "num_experts"])
    def _mma_glu_kernel(XQ, SX, IDS, BLK, TOPK_W, W, WS, Z, ZS, P, CNT, I, K, top_k, num_experts, limit,
                        stride_x, stride_sx, stride_we, stride_wn, stride_wse, stride_wsn, stride_z, stride_zs,
                        stride_ps, stride_pp,
                        BN: tl.constexpr, U: tl.constexpr, KD: tl.constexpr, QUANT_OUT: tl.constexpr,
                        USE_ASM: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr,
                        G: tl.constexpr, NC: tl.constexpr, SCALE_WORDS: tl.constexpr):
        """z[p, n] = bf16(rw * silu(min(gate, L)) * clamp(up, -L, L)) for BN rows n of pair p; QUANT_OUT
        (BN == 128, one quantisation block): z re-quantised to e4m3, stored as f16 values + fp32 scale.
        SPLIT: K range program_id(2) of num_programs(2); P [S, pairs, 2I] fp32 partials (gate, up),
        CNT one arrival counter per (pair, row tile).
        G > 1: program_id(0) is a block of BLK (dsv4.kernels.moe_gemv_pairs): G pairs of one expert, NC MMA
        columns (max(16, 4 U G))."""
        pdl_wait()
        pid_n = tl.program_id(1)
        if G > 1:
            p, e = _block_first(BLK, IDS, num_experts, G)
            if p < 0:  # an unused block
                return
            pc, live = _column_pairs(BLK, G, NC, U)
            xrows = XQ + pc // top_k * stride_x
            sxrows = SX + pc // top_k * stride_sx
        else:
            p = tl.program_id(0).to(tl.int64)
            e = tl.load(IDS + p).to(tl.int64)
            if (e < 0) | (e >= num_experts):  # another rank's expert (its z row is never read)
                return
        t = p // top_k
        offs_n = pid_n * BN + tl.arange(0, BN)
        Wg = W + e * stride_we + offs_n[:, None] * stride_wn + tl.arange(0, 64 * KD)[None, :]
        Wu = Wg + I * stride_wn
        Sg = WS + e * stride_wse + offs_n[:, None] * stride_wsn  # E8M0 bytes, 4 per K block
        Su = Sg + I * stride_wsn
        Xrow = XQ + t * stride_x
        SXrow = SX + t * stride_sx
        acc_g = tl.zeros((BN, NC), dtype=tl.float32)
        acc_u = tl.zeros((BN, NC), dtype=tl.float32)
        kb_lo, kb_hi = _k_range(K, U, SPLIT)
        if PREFETCH > 0:  # the first K blocks of the gate and up rows into L2 at once (`GLU_PREFETCH_KBLOCKS`)
            rows = e * stride_we + offs_n.to(tl.int64) * stride_wn
            nbytes = tl.minimum(kb_hi - kb_lo, PREFETCH) * 64
            prefetch_l2(W + kb_lo * 64, rows, nbytes)
            prefetch_l2(W + kb_lo * 64, rows + I * stride_wn, nbytes)
        for kb0 in range(kb_lo, kb_hi, U):
            part_g = tl.zeros((BN, NC), dtype=tl.float32)
            part_u = tl.zeros((BN, NC), dtype=tl.float32)
            for d in tl.static_range(0, U, KD):
                if G > 1:
                    a_lo, a_hi = _act_tiles_g(xrows, live, kb0 + d, d, KD, NC, U)
                else:
                    a_lo, a_hi = _act_tiles(Xrow, kb0 + d, d, KD)
                bg = _mma_order(tl.load(Wg + (kb0 + d) * 64), BN, KD)
                part_g = tl.dot(_f16_hi(bg, USE_ASM), a_hi, tl.dot(_f16_lo(bg, USE_ASM), a_lo, part_g))
                bu = _mma_order(tl.load(Wu + (kb0 + d) * 64), BN, KD)
                part_u = tl.dot(_f16_hi(bu, USE_ASM), a_hi, tl.dot(_f16_lo(bu, USE_ASM), a_lo, part_u))
            if G > 1:
                sa = _act_scales_g(sxrows, live, kb0, NC, U)
            else:
                sa = _act_scales(SXrow, kb0, U)
            acc_g = _scale_acc(acc_g, part_g, Sg, sa, kb0, U, G, NC, SCALE_WORDS)
            acc_u = _scale_acc(acc_u, part_u, Su, sa, kb0, U, G, NC, SCALE_WORDS)
        if G > 1:  # no split: the host allows no SPLIT with G > 1
            for j in tl.static_range(G):
                pj = _block_member(BLK, j, G)
                if pj >= 0:
                    _glu_out(_pair_sum(acc_g, j, NC, U), _pair_sum(acc_u, j, NC, U), pj, pid_n, offs_n, TOPK_W, Z,
                             ZS, limit, stride_z, stride_zs, BN, QUANT_OUT)
            return
        gate = tl.sum(acc_g, axis=1)
        up = tl.sum(acc_u, axis=1)
        if SPLIT:  # gate at P[k, p, n], up at P[k, p, I + n]; the tile's last arriver sums each over k
            Pg = P + p * stride_pp + offs_n
            tile = p * tl.num_programs(1) + pid_n
            Pk = Pg + tl.program_id(2).to(tl.int64) * stride_ps
            tl.store(Pk, gate)
            tl.store(Pk + I, up)
            if _arrive(CNT, tile):
                gate = _split_sum(Pg, stride_ps, BN)
                up = _split_sum(Pg + I, stride_ps, BN)
                tl.store(CNT + tile, 0)  # every program has arrived: ready for the next launch / replay
                _glu_out(gate, up, p, pid_n, offs_n, TOPK_W, Z, ZS, limit, stride_z, stride_zs, BN, QUANT_OUT)
        else:
            _glu_out(gate, up, p, pid_n, offs_n, TOPK_W, Z, ZS, limit, stride_z, stride_zs, BN, QUANT_OUT)

    @pdl_kernel
    @triton.jit(do_not_specialize=["num_experts"])
    def _mma_down_kernel(ZQ, ZS, IDS, BLK, W, WS, Y, P, CNT, K, num_experts,
                         stride_zq, stride_zs, stride_we, stride_wn, stride_wse, stride_wsn, stride_y,
                         stride_ps, stride_pp,
                         BN: tl.constexpr, U: tl.constexpr, KD: tl.constexpr, USE_ASM: tl.constexpr,
                         SPLIT: tl.constexpr, PREFETCH: tl.constexpr, G: tl.constexpr, NC: tl.constexpr,
                         SCALE_WORDS: tl.constexpr):
        """y[p, n] = bf16(W2_e[n] . z_p) for BN rows n of pair p (z as f16 values of its e4m3 codes).
        SPLIT: as in `_mma_glu_kernel`, P [S, pairs, D] fp32 partials.
        G > 1: as in `_mma_glu_kernel` (no SPLIT)."""
        pdl_wait()
        if G > 1:
            p, e = _block_first(BLK, IDS, num_experts, G)
            if p < 0:
                return
            pc, live = _column_pairs(BLK, G, NC, U)
            zrows = ZQ + pc * stride_zq
            zsrows = ZS + pc * stride_zs
        else:
            p = tl.program_id(0).to(tl.int64)
            e = tl.load(IDS + p).to(tl.int64)
        if (e < 0) | (e >= num_experts):
            return
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
        Wr = W + e * stride_we + offs_n[:, None] * stride_wn + tl.arange(0, 64 * KD)[None, :]
        Sr = WS + e * stride_wse + offs_n[:, None] * stride_wsn
        Zrow = ZQ + p * stride_zq
        ZSrow = ZS + p * stride_zs
        acc = tl.zeros((BN, NC), dtype=tl.float32)
        kb_lo, kb_hi = _k_range(K, U, SPLIT)
        if PREFETCH > 0:
            prefetch_l2(W + kb_lo * 64, e * stride_we + offs_n.to(tl.int64) * stride_wn,
                        tl.minimum(kb_hi - kb_lo, PREFETCH) * 64)
        for kb0 in range(kb_lo, kb_hi, U):
            part = tl.zeros((BN, NC), dtype=tl.float32)
            for d in tl.static_range(0, U, KD):
                if G > 1:
                    a_lo, a_hi = _act_tiles_g(zrows, live, kb0 + d, d, KD, NC, U)
                else:
                    a_lo, a_hi = _act_tiles(Zrow, kb0 + d, d, KD)
                b = _mma_order(tl.load(Wr + (kb0 + d) * 64), BN, KD)
                part = tl.dot(_f16_hi(b, USE_ASM), a_hi, tl.dot(_f16_lo(b, USE_ASM), a_lo, part))
            if G > 1:
                acc = _scale_acc(acc, part, Sr, _act_scales_g(zsrows, live, kb0, NC, U), kb0, U, G, NC, SCALE_WORDS)
            else:
                acc = _scale_acc(acc, part, Sr, _act_scales(ZSrow, kb0, U), kb0, U, 1, NC, SCALE_WORDS)
        if G > 1:
            for j in tl.static_range(G):
                pj = _block_member(BLK, j, G)
                if pj >= 0:
                    tl.store(Y + pj * stride_y + offs_n, _pair_sum(acc, j, NC, U).to(tl.bfloat16))
            return
        y = tl.sum(acc, axis=1)
        if SPLIT:
            Py = P + p * stride_pp + offs_n
            tile = p * tl.num_programs(1) + tl.program_id(1)
            tl.store(Py + tl.program_id(2).to(tl.int64) * stride_ps, y)
            if _arrive(CNT, tile):
                y = _split_sum(Py, stride_ps, BN)
                tl.store(CNT + tile, 0)
                tl.store(Y + p * stride_y + offs_n, y.to(tl.bfloat16))
        else:
            tl.store(Y + p * stride_y + offs_n, y.to(tl.bfloat16))

    @pdl_kernel
    @triton.jit(do_not_specialize=["num_experts"])
    def _quant16_kernel(X, Q, S, IDS, num_experts, stride_x, stride_q, stride_s, CHECK_IDS: tl.constexpr):
        """FP8 quantisation of one 128-block of a row (`act_quant`'s math), stored as the f16 values of the
        e4m3 codes (exact) in the order of `_act_pos` + fp32 scale; CHECK_IDS: rows are pairs, other ranks'
        pairs skipped."""
        pdl_wait()
        r = tl.program_id(0).to(tl.int64)
        kb = tl.program_id(1)
        if CHECK_IDS:
            e = tl.load(IDS + r)
            if (e < 0) | (e >= num_experts):
                return
        quant16_block(X + r * stride_x, Q + r * stride_q, S + r * stride_s, kb)


def _unroll(k: int, most: int) -> int:
    """K blocks per loop step: the largest of most, most/2, .. 1 that divides k // 128."""
    u = most
    while (k // BLOCK) % u:
        u //= 2
    return u


def _pairs_fit(d: int, i: int, unroll: int, split: int, split_down: int, g: int) -> bool:
    """Blocks of g pairs (dsv4.kernels.moe_gemv_pairs): at most 32 MMA columns (4 per K block of a loop step
    and pair) in both GEMMs, no split."""
    return 4 * g * max(_unroll(d, unroll), _unroll(i, unroll)) <= MAX_COLUMNS and split == 1 and split_down == 1


def pairs_fit(cfg, d: int, i: int, num_pairs: int) -> bool:
    """Whether MoEConfig cfg's blocks of pairs apply to hidden d / inter i and num_pairs pairs (method "mma")."""
    return (cfg.gemv_mma and num_pairs <= MAX_PAIRS
            and _pairs_fit(d, i, cfg.gemv_unroll, cfg.gemv_split, cfg.gemv_split_down, cfg.gemv_pairs))


def _use_asm() -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1"  # the interpreter runs no inline PTX


GEMV_METHODS = ("cuda", "mma")
MMA_BN = (64, 128)  # wgmma's M side: 64 rows per warpgroup
MAX_COLUMNS = 32  # wgmma's N side with blocks of pairs (accumulator registers)
# K blocks (64 bytes per row each) of its weight rows that a method-"mma" GLU / down program starts into L2 as
# soon as it knows its expert (0: off). Session 15 (s15a, bench_moe_flags, ms M = 1 / 8 / 64): default 0.19 /
# 0.25 / 1.61, 8 blocks 0.37 / 0.28 / 1.61, 32 blocks 0.15 / 0.32 / 1.61 -- no consistent gain, stays off.
GLU_PREFETCH_KBLOCKS = 0
# the "mma" GEMVs read each row's E8M0 scale bytes of a loop step as 32-bit words (`_scale_acc`'s WORDS) instead
# of one byte load per accumulator element (offline SASS, decode GLU: 16 LDG.E.U8 -> 8 LDG.E per K step, 154 -> 96
# registers), in launches of at least SCALE_WORDS_MIN_PAIRS pairs per program. Flash MoE (H200, bytes -> words):
# in CUDA graphs (s33e, sweep_moe_gemv.py --default-only, two repeats, one pair per program) M = 1 (split K)
# 42.6 -> 47.7 µs, M = 8 238.1 -> 235.2 µs; fused_moe's launches (two pairs per program from M = 8), L2-flushed
# (s33c/s33d, three repeats) M = 16 0.419 -> 0.402 ms, M = 64 1.17 -> 1.10; 8-layer decode replay B = 8 3.13 ->
# 3.07 ms. So the slow case is the split K of one pair; M = 4 (one pair, no split) stays on bytes, untimed. The
# same scales; the down GEMV's row sums may differ in the last bit (0.005 % of a Flash call's outputs, s33e's
# bench/probe_scale_words.py: the GLU's bits equal, each variant as close to fused_moe_ref)
SCALE_WORDS = True
SCALE_WORDS_MIN_PAIRS = 2


def moe_gemv(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: PackedExperts,
             swiglu_limit: float, bn: int = 32, num_warps: int = 4, unroll: int = 2, method: str = "cuda",
             num_stages: int = 3, dot_blocks: int = 1, split: int = 1, split_down: int = 1,
             down_stages: int = 0, down_dot_blocks: int = 0, out: torch.Tensor | None = None, shared=None,
             pairs_per_program: int = 1, x_quant: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The routed pairs' W2 outputs y [M * top_k, D] bf16 (one row per pair; rows of other ranks'
    pairs are left unwritten); `fused_moe` sums them in its combine kernel. With `out` [M, D] (bf16, or
    fp32 for an expert-parallel partial): the combine into out [+ shared: a tensor or a join, called before
    the combine] is done too and out returned.

    method "cuda": CUDA-core sums, `unroll` K blocks loaded per loop step (num_stages unused), `split` /
    `split_down` as below (each split a whole number of loop steps).
    method "mma": tensor-core group sums (module docstring), bn in MMA_BN, `unroll` (1, 2 or 4) K blocks
    per loop step (one scale update: 4 columns each), `dot_blocks` (1, 2 or 4, at most unroll) K blocks
    per tl.dot (fewer wgmma waits, more registers), `num_stages` pipeline depth of the weight and
    activation loads (whole loop steps), `split` / `split_down` programs per row tile of the GLU / down
    kernel along K (split-K reduced in the launch, module docstring; at most one per loop step),
    `pairs_per_program` 2 or 4: that many pairs of one expert per program (dsv4.kernels.moe_gemv_pairs; needs
    4 x pairs x K blocks per step <= MAX_COLUMNS and no split); `down_stages` / `down_dot_blocks`: the Triton down
    kernel's num_stages / dot_blocks where they differ from the GLU's (0: the same); `x_quant`: x already quantised as
    `quant16_block` stores it ([M, D] f16, [M, D/128] fp32: the router's launch wrote them), else its own launch."""
    check_packed(experts)
    if experts.fmt != "mxfp4":
        raise ValueError("moe_gemv: MXFP4 experts only")
    if method not in GEMV_METHODS:
        raise ValueError(f"moe_gemv: method must be one of {GEMV_METHODS}, got {method!r}")
    for name, s in (("split", split), ("split_down", split_down)):
        if not isinstance(s, int) or s < 1:
            raise ValueError(f"moe_gemv: {name} must be a positive int, got {s!r}")
    m, d = x.shape
    top_k = topk_ids.shape[1]
    e, i = experts.num_experts, experts.inter
    if i % bn or d % bn:
        raise ValueError(f"moe_gemv: bn {bn} must divide inter {i} and hidden {d}")
    pairs = m * top_k
    ids = topk_ids.reshape(-1).contiguous()
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    if method == "mma":
        down_dot_blocks = down_dot_blocks or dot_blocks
        if bn not in MMA_BN or unroll not in (1, 2, 4) or any(b not in (1, 2, 4) or b > unroll
                                                              for b in (dot_blocks, down_dot_blocks)):
            raise ValueError(f"moe_gemv(method='mma'): need bn in {MMA_BN}, unroll in (1, 2, 4) and dot_blocks in "
                             f"(1, 2, 4) <= unroll, got bn={bn}, unroll={unroll}, dot_blocks={dot_blocks} / "
                             f"{down_dot_blocks}")
        if not isinstance(down_stages, int) or down_stages < 0:
            raise ValueError(f"moe_gemv: down_stages must be an int >= 0 (0: num_stages), got {down_stages!r}")
        launch = dict(bn=bn, num_warps=num_warps, unroll=unroll, dot_blocks=dot_blocks, num_stages=num_stages)
        if pairs_per_program not in PAIRS_PER_PROGRAM:
            raise ValueError(f"moe_gemv: pairs_per_program must be in {PAIRS_PER_PROGRAM}, got {pairs_per_program!r}")
        if pairs_per_program > 1:
            if not _pairs_fit(d, i, unroll, split, split_down, pairs_per_program):
                raise ValueError(f"moe_gemv: pairs_per_program={pairs_per_program} needs at most {MAX_COLUMNS} MMA "
                                 "columns (4 per pair and K block of a loop step: unroll) and no split")
            launch["blocks"] = pair_blocks(ids, e, pairs_per_program)
        zq = torch.empty((pairs, i), dtype=torch.float16, device=x.device)
        zs = torch.empty((pairs, i // BLOCK), dtype=torch.float32, device=x.device)
        persistent = out is not None and moe_glu_decode.applies(experts, x, launch.get("blocks"), down=True)
        fold = persistent and moe_glu_decode.FINISH_IN_DOWN and moe_glu_decode.applies(experts, x, launch.get("blocks"))
        glu_part = mma_glu_stage(x, ids, tw, experts, swiglu_limit, top_k, zq, zs, split=split, x_quant=x_quant,
                                 finish=not fold, **launch)
        if persistent:  # (fp32 partials: summed by the combine; fold: z finished by the down from the GLU's)
            y = moe_glu_decode.down_decode(zq, zs, ids, experts, fin=(glu_part, tw, swiglu_limit) if fold else None)
        else:
            y = torch.empty((pairs, d), dtype=torch.bfloat16, device=x.device)
            mma_down_stage(zq, zs, ids, experts, y, split=split_down, **{
                **launch, "num_stages": down_stages or num_stages, "dot_blocks": down_dot_blocks})
    else:
        from dsv4.kernels.moe_gemv_cuda import gemv_cuda
        y = gemv_cuda(x, ids, tw, experts, swiglu_limit, top_k, bn, num_warps, unroll, split, split_down)
    if out is None:
        return y
    from dsv4.kernels.moe_combine import combine
    return combine(y, shared, ids.view(m, top_k), out, e)


def mma_glu_stage(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, experts: PackedExperts, swiglu_limit: float,
                  top_k: int, zq: torch.Tensor, zs: torch.Tensor, bn: int = 64, num_warps: int = 4, unroll: int = 2,
                  dot_blocks: int = 1, num_stages: int = 3, split: int = 1, blocks: torch.Tensor | None = None,
                  x_quant: tuple[torch.Tensor, torch.Tensor] | None = None, finish: bool = True) -> torch.Tensor | None:
    """GEMM1 of method "mma": writes the rows of the routed pairs (ids in [0, E)) of zq [pairs, I] (f16 values
    of the e4m3 codes of z, each 128-block in the order of `_act_pos`) and zs [pairs, I/128] (fp32 scales);
    split > 1: that many programs per row tile along K (`_split_k`); blocks: `pair_blocks`' [P, G] blocks of G
    pairs per program; x_quant: as in `moe_gemv`. Launches: x quantisation (unless x_quant), the GLU, z
    re-quantisation (bn 64). Where `moe_glu_decode.applies`, its kernel instead (bn, unroll, split ignored); there
    finish False returns its fp32 partials unfinished (zq / zs unwritten: `moe_glu_decode.down_decode(fin=)`)."""
    m, d = x.shape
    e, i = experts.num_experts, experts.inter
    pairs = ids.numel()
    paired = blocks is not None
    x = x if x.stride(-1) == 1 else x.contiguous()
    if x_quant is None:
        xq = torch.empty((m, d), dtype=torch.float16, device=x.device)
        sx = torch.empty((m, d // BLOCK), dtype=torch.float32, device=x.device)
        _quant16_kernel[(m, d // BLOCK)](x, xq, sx, ids, e, x.stride(0), xq.stride(0), sx.stride(0),
                                         CHECK_IDS=False, num_warps=1)
    else:
        xq, sx = check_x_quant("moe_gemv", x_quant, x)
    if moe_glu_decode.applies(experts, x, blocks):  # the persistent Gluon GLU (its own K split and row tiles)
        return moe_glu_decode.glu_decode(xq, sx, ids, tw, experts, swiglu_limit, top_k, zq, zs, finish=finish)
    quant_out = bn == BLOCK  # a program's z tile is one quantisation block: quantised in the epilogue
    z = zq if quant_out else torch.empty((pairs, i), dtype=torch.bfloat16, device=x.device)
    w13, s13 = experts.w13, experts.w13_scale.view(torch.uint8)  # [E, 2I, D/32] E8M0 bytes
    u = _unroll(d, unroll)
    g, nc = _block_shape(blocks, u)
    split, part, counters = _split_k(split, d // BLOCK // u, (pairs, 2 * i), pairs * (i // bn), zs)
    _mma_glu_kernel[(pairs, i // bn, split)](
        xq, sx, ids, blocks if paired else ids, tw, w13, s13, z, zs, part, counters, i, d, top_k, e,
        float(swiglu_limit), xq.stride(0), sx.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1),
        z.stride(0), zs.stride(0), part.stride(0), part.stride(1), BN=bn, U=u, KD=min(dot_blocks, u),
        QUANT_OUT=quant_out, USE_ASM=_use_asm(), SPLIT=split > 1, PREFETCH=GLU_PREFETCH_KBLOCKS, G=g, NC=nc,
        SCALE_WORDS=_scale_words(s13, g), num_warps=num_warps, num_stages=num_stages)
    if not quant_out:
        _quant16_kernel[(pairs, i // BLOCK)](z, zq, zs, ids, e, z.stride(0), zq.stride(0), zs.stride(0),
                                             CHECK_IDS=True, num_warps=1)


def mma_down_stage(zq: torch.Tensor, zs: torch.Tensor, ids: torch.Tensor, experts: PackedExperts, y: torch.Tensor,
                   bn: int = 64, num_warps: int = 4, unroll: int = 2, dot_blocks: int = 1, num_stages: int = 3,
                   split: int = 1, blocks: torch.Tensor | None = None) -> None:
    """GEMM2 of method "mma": writes the rows of the routed pairs of y [pairs, D] bf16 from zq / zs
    (`mma_glu_stage`'s layout); split > 1: that many programs per row tile along K (`_split_k`). blocks: as in
    `mma_glu_stage`."""
    e, i = experts.num_experts, experts.inter
    pairs, d = ids.numel(), experts.hidden
    w2, s2 = experts.w2, experts.w2_scale.view(torch.uint8)
    u = _unroll(i, unroll)
    split, part, counters = _split_k(split, i // BLOCK // u, (pairs, d), pairs * (d // bn), zs)
    paired = blocks is not None
    g, nc = _block_shape(blocks, u)
    if paired and split > 1:
        raise ValueError("mma_down_stage: blocks of pairs take no split")
    _mma_down_kernel[(pairs, d // bn, split)](
        zq, zs, ids, blocks if paired else ids, w2, s2, y, part, counters, i, e, zq.stride(0), zs.stride(0),
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), y.stride(0), part.stride(0), part.stride(1),
        BN=bn, U=u, KD=min(dot_blocks, u), USE_ASM=_use_asm(), SPLIT=split > 1, PREFETCH=GLU_PREFETCH_KBLOCKS,
        G=g, NC=nc, SCALE_WORDS=_scale_words(s2, g), num_warps=num_warps, num_stages=num_stages)


def _scale_words(scales: torch.Tensor, pairs_per_program: int) -> bool:
    """SCALE_WORDS for this [E, N, K/32] byte tensor and launch: only where every row start is 4-byte aligned (else
    bytes) and a program takes at least SCALE_WORDS_MIN_PAIRS pairs."""
    aligned = scales.data_ptr() % 4 == 0 and scales.stride(0) % 4 == 0 and scales.stride(1) % 4 == 0 \
        and scales.stride(2) == 1
    return SCALE_WORDS and pairs_per_program >= SCALE_WORDS_MIN_PAIRS and aligned


def _block_shape(blocks: torch.Tensor | None, u: int) -> tuple[int, int]:
    """(pairs per program G, MMA columns NC) of a launch with u K blocks per loop step: one pair and 16 columns
    without blocks, 4u columns per pair with them."""
    g = 1 if blocks is None else blocks.shape[1]
    return g, max(16, 4 * u * g)


def _split_k(split: int, steps: int, shape: tuple[int, int], tiles: int, unused: torch.Tensor):
    """(S, fp32 partials [S, *shape], arrival counters) of a split-K launch; S = split capped at the loop steps
    (no empty K range). S = 1: `unused` (a 2-D tensor of the launch) in place of both, nothing allocated."""
    if not isinstance(split, int) or split < 1:
        raise ValueError(f"moe_gemv: split must be a positive int, got {split!r}")
    split = min(split, steps)
    if split == 1:
        return 1, unused, unused
    device = unused.device
    # every element read by a last arriver was written in the same launch (skipped pairs read nothing)
    part = torch.empty((split, *shape), dtype=torch.float32, device=device)
    return split, part, arrival_counters("moe_gemv split-K", device, tiles)
