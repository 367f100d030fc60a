"""Offline sm_90a compile of the decode-path Triton kernels (and Gluon ones): registers, spills, SASS instruction
mix, and the register layouts of their global loads -- no GPU needed (triton 3.6's bundled ptxas and cuobjdump).

A development aid for issue #6, not a benchmark. Session 19 found the paged decode attention's 2-3x this way:
a per-element scale index put its [16, 512] candidate tile in a one-element-per-thread layout
(`sizePerThread = [1, 1]` on the tile's loads below), which Nsight Compute only showed as shared-memory stalls.

    python bench/sass_stats.py [name ...] [--layouts] [--stages N] [--loops [--hist N]] [--grep REGEX]

Names: see CASES (all by default). `--layouts` prints each load's layout from the TTGIR. Integer arguments
named in a case's `div16` are compiled as multiples of 16, as Triton specialises them at launch.
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ATTN_T = dict(Q="*bf16", POS="*i32", COS="*fp32", SIN="*fp32", SINK="*fp32", OUT="*bf16", PACC="*fp32", PML="*fp32",
              WQ="*fp8e4nv", WS="*u8", WR="*bf16", WTAB="*i32", CQ="*fp8e4nv", CS="*u8", CR="*bf16", CTAB="*i32",
              CIDX="*i32", CCNT="*i32", scale="fp32")
ATTN_C = dict(HD=512, NOPE=448, BH=16, BN=16, ROT=False, INTERP=False, SPLIT=True, WIN=128)
GLUON_ATTN_T = dict(Q="*bf16", K="*bf16", E="*bf16", IDX="*i32", SINK="*fp32", OUT="*bf16", COS="*fp32",
                    SIN="*fp32", QCOS="*fp32", QSIN="*fp32", scale="fp32", q_eps="fp32")
GLUON_ATTN_C = dict(D=512, BN=64, STAGES=2, HAS_E=True, ROT=True, NOPE=448, CAUSAL_R=0, QNORM=True, QNOPE=448,
                    NO_COPY=False, PRE_IDX=True)
GLUON_ATTN_DIV16 = ("stride_qt", "stride_qh", "stride_kt", "stride_et", "stride_it", "stride_ot", "stride_oh",
                    "stride_qc")
MIX_T = {n: "*bf16" for n in ("X", "F", "XOUT", "FH", "FL")} | {n: "*fp32" for n in ("POST", "COMB", "PART", "SQ")}
MIX_C = dict(DO_MIX=True, NP=32, BT=16, BK=64, INTERP=False, TRANS=False, COMB_ONCE=False)
WIDE_T = dict(A="*bf16", W="*u8", WS="*i32", C="*bf16", SORTED="*i32", EXPERT_IDS="*i32", NUM_POST="*i32",
              TOPK_W="*fp32", limit="fp32", TILES="*i32")
WIDE_C = dict(BM=128, BN=64, GLU=True, NW=4, STAGES=4, A_SMEM=False, GROUP_M=4, LISTED=True, STORE_T=False)
WIDE_DIV16 = ("K", "up_off", "stride_am", "stride_we", "stride_wn", "stride_cm")
# the decode MoE GEMVs (moe_gemv "mma", one pair per program)
GLU_B1_T = dict(XQ="*fp16", SX="*fp32", IDS="*i32", BLK="*i32", TOPK_W="*fp32", W="*u8", WS="*u8", Z="*fp16",
                ZS="*fp32", P="*fp32", CNT="*i32", limit="fp32")
GLU_B1_C = dict(BN=64, U=2, KD=1, QUANT_OUT=False, USE_ASM=True, SPLIT=True, PREFETCH=0, G=1, NC=16)
GLU_B1_DIV16 = ("I", "K", "stride_x", "stride_sx", "stride_we", "stride_wn", "stride_wse", "stride_z", "stride_ps",
                "stride_pp")
DOWN_B1_T = dict(ZQ="*fp16", ZS="*fp32", IDS="*i32", BLK="*i32", W="*u8", WS="*u8", Y="*bf16", P="*fp32", CNT="*i32")
DOWN_B1_C = dict(BN=64, U=2, KD=1, USE_ASM=True, SPLIT=False, PREFETCH=0, G=1, NC=16)
DOWN_B1_DIV16 = ("K", "stride_zq", "stride_we", "stride_wn", "stride_wse", "stride_y", "stride_ps")

GEMM_T = dict(A="*bf16", SA="*bf16", W="*fp8e4nv", SW="*u8", C="*bf16", P="*fp32", CNT="*i32")
GEMM_C = dict(BM=16, BN=128, GROUP_M=8, SWAP_AB=True, FUSE_QUANT=True, SW_E8M0=True, SPLIT_OUT=False, KBP=8,
              PREFETCH=0)
GEMM_DIV16 = ("N", "K", "stride_am", "stride_ag", "stride_sam", "stride_sag", "stride_wn", "stride_wg", "stride_swg",
              "stride_cm", "stride_cg", "stride_pm", "stride_pg", "stride_ps")  # (0 at a plain launch: divisible)
GLU_FP8_T = dict(A="*fp8e4nv", AS="*fp32", W="*u8", WS="*i32", TB="*i32", C="*bf16", SORTED="*i32",
                 EXPERT_IDS="*i32", NUM_POST="*i32", TOPK_W="*fp32", TILES="*i32", limit="fp32")
GLU_FP8_C = dict(BM=128, STAGES=4, GROUP_M=4, LISTED=True)
GLU_FP8_DIV16 = ("K", "up_off", "stride_am", "stride_we", "stride_wn", "stride_cm", "stride_tbe", "stride_tbn")



def _desc(block: tuple[int, int], swizzle: int) -> str:
    """The signature type of a Gluon TMA descriptor of uint8 blocks `block` with that NVMMA swizzle (bytes)."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=8, rank=2)
    return mangle_type(TensorDescriptor.from_tensor(torch.empty(256, 256, dtype=torch.uint8), list(block), layout))


def _stream_case(**constexprs) -> tuple:
    """A case of `moe_glu_decode._stream_kernel` (Flash's expert shape): these constexprs over one pair per item, unit
    by unit, 200 registers in the second consumer, the down's units CONTIG."""
    glu = constexprs["GLU"]
    return ("moe_glu_decode", "_stream_kernel",
            dict(w_desc=_desc((64, 64), 64), s_desc=_desc((64, 16), 0), XQ="*fp16", SX="*fp32", IDS="*i32",
                 P="*fp32", FIN="*fp32", TOPK_W="*fp32", limit="fp32"),
            {"REGS": 200, "CONTIG": not glu, "RUN": 1, "NR": 0, **constexprs}, 4, 1,
            ("I", *(() if glu else ("rows_e",)), "stride_x", "stride_sx", "stride_ps", "stride_pp", "stride_fs",
             "stride_fp"))


# name: (module, kernel, argument types (others i32), constexprs, num_warps, num_stages, div16 arguments)
CASES = {
    "attn_sliding": ("attention", "_decode_attn_kernel", ATTN_T, dict(ATTN_C, HAS_COMP=False, INDEXED=False), 8,
                     "attention.DECODE_STAGES", ()),
    "attn_csa": ("attention", "_decode_attn_kernel", ATTN_T, dict(ATTN_C, HAS_COMP=True, INDEXED=True), 8,
                 "attention.DECODE_STAGES", ()),
    # HCA with the q heads' norm + RoPE in the kernel (attention.DECODE_Q_NORM_IN_KERNEL)
    "attn_hca_qnorm": ("attention", "_decode_attn_kernel", dict(ATTN_T, QCOS="*fp32", QSIN="*fp32", q_eps="fp32"),
                       dict(ATTN_C, HAS_COMP=True, INDEXED=False, QNORM=True), 8, "attention.DECODE_STAGES", ()),
    "indexer_scores": ("indexer_scores", "_scores_kernel",
                       dict(Q="*bf16", W="*bf16", PQ="*i8", PS="*u8", PAGE="*i32", OFF="*i32", PRESENT="*i1",
                            OUT="*bf16"), dict(HP=64, D=128, BN=64, FP4=True, INTERP=False), 4, 3,
                       ("pq_page", "pq_off", "ps_page", "sq_b", "sq_h", "sw_b")),
    # ... with the row's top-k by its last-arriving program (indexer.TOPK_IN_SCORES; indexer_scores.PICK_BLOCK chunks)
    "indexer_scores_topk": ("indexer_scores", "_scores_kernel",
                            dict(Q="*bf16", W="*bf16", PQ="*i8", PS="*u8", PAGE="*i32", OFF="*i32", PRESENT="*u8",
                                 OUT="*bf16", CNT="*i32", PICKED="*i64", VALID="*u8"),
                            dict(HP=64, D=128, BN=64, FP4=True, INTERP=False, TOPK=True, KBLOCK=512), 4, 3,
                            ("pq_page", "pq_off", "ps_page", "sq_b", "sq_h", "sw_b")),
    "store_indexer": ("cache_store", "_store_kernel",
                      dict(X="*fp32", PAGE="*i64", OFF="*i64", W="*bf16", COS="*fp32", SIN="*fp32", H="*fp32",
                           Q="*i8", S="*u8", ROPE="*bf16", eps="fp32"),
                      dict(D=128, NOPE=128, ROPE0=64, NORM=True, ROT=True, HADAMARD=True, FP4=True),
                      4, 3, ("stride_x", "q_page", "q_off", "s_page", "r_page", "r_off")),
    "norm_rope_indexer_q": ("norm_rope", "_norm_rope_kernel",
                            dict(X="*bf16", OUT="*bf16", W="*bf16", COS="*fp32", SIN="*fp32", H="*bf16", eps="fp32",
                                 hscale="fp32"),
                            dict(D=128, DP=128, ROPE0=64, NOPE=0, NORM=0, ROT=True, INV=False, SIM=2, BR=16, INTERP=False),
                            4, 3, ()),
    "mhc_mix": ("mhc_kernels", "_mix_kernel", MIX_T, dict(MIX_C, FUSE_POST=False), 4, 3, ("D", "d_per_split")),
    "mhc_mix_post": ("mhc_kernels", "_mix_kernel", MIX_T, dict(MIX_C, FUSE_POST=True), 4, 3, ("D", "d_per_split")),
    # ... summing a deferred MoE combine (block.COMBINE_IN_NEXT_SITE at 2-16 tokens)
    "mhc_mix_post_combine": ("mhc_kernels", "_mix_kernel", dict(MIX_T, CY="*fp32", CS="*bf16", CIDS="*i32"),
                             dict(MIX_C, FUSE_POST=True, COMBINE=True, C_SHARED=True, C_RANGES=2), 4, 3,
                             ("D", "d_per_split")),
    # ... at prefill sizes (> 16 tokens: mhc.FUSED_BT / MIX_BT rows, the transposed dot, MIX_STAGES = 2)
    "mhc_mix_prefill": ("mhc_kernels", "_mix_kernel", MIX_T, dict(MIX_C, FUSE_POST=False, BT=64, TRANS=True), 4,
                        2, ("D", "d_per_split")),
    "mhc_mix_post_prefill": ("mhc_kernels", "_mix_kernel", MIX_T,
                             dict(MIX_C, FUSE_POST=True, BT=32, TRANS=True, COMB_ONCE=True), 4, 2, ("D", "d_per_split")),
    "mhc_rows_post": ("mhc_kernels", "_mix_rows_kernel", MIX_T, dict(FUSE_POST=True, NM=32, NP=32, BK=64,
                                                                      PREFETCH=True), 4, 1,
                      ("D", "d_per_split", "HCD")),
    # ... with mhc.ROWS_FN_EARLY (fn's tiles loaded before the PDL wait)
    "mhc_rows_post_fn_early": ("mhc_kernels", "_mix_rows_kernel", MIX_T,
                               dict(FUSE_POST=True, NM=32, NP=32, BK=64, PREFETCH=True, FN_EARLY=True), 4, 1,
                               ("D", "d_per_split", "HCD")),
    # ... summing a deferred MoE combine (block.COMBINE_IN_NEXT_SITE: 2 fp32 partial ranges of the persistent down
    # + the shared expert's row)
    "mhc_rows_post_combine": ("mhc_kernels", "_mix_rows_kernel",
                              dict(MIX_T, CY="*fp32", CS="*bf16", CIDS="*i32"),
                              dict(FUSE_POST=True, NM=32, NP=32, BK=64, PREFETCH=True, FN_EARLY=True, COMBINE=True,
                                   C_SHARED=True, C_RANGES=2), 4, 1, ("D", "d_per_split", "HCD")),
    # the routed MoE's combine over the persistent down's fp32 partials (2 ranges) + the shared expert's row
    "moe_combine_partials": ("moe_combine", "_moe_combine_kernel", dict(Y="*fp32", S="*bf16", IDS="*i32", OUT="*bf16"),
                             dict(HAS_SHARED=True, BD=256, RANGES=2), 4, 3, ("D", "stride_r")),
    "moe_glu_b1": ("moe_gemv", "_mma_glu_kernel", GLU_B1_T, dict(GLU_B1_C, SCALE_WORDS=False), 4, 3, GLU_B1_DIV16),
    # ... with the scale bytes read as 32-bit words (moe_gemv.SCALE_WORDS)
    "moe_glu_b1_words": ("moe_gemv", "_mma_glu_kernel", GLU_B1_T, dict(GLU_B1_C, SCALE_WORDS=True), 4, 3,
                         GLU_B1_DIV16),
    "attn_combine": ("attention", "_combine_wide_kernel",
                     dict(PACC="*fp32", PML="*fp32", SINK="*fp32", COS="*fp32", SIN="*fp32", OUT="*bf16"),
                     dict(HD=512, NOPE=448, BH=16, BD=32, SP=32, ROT=True), 4, 3, ()),
    "mhc_finish": ("mhc_kernels", "_finish_split_kernel",
                   {n: "*bf16" for n in ("X", "NORM_W", "U", "NORMED")} | {n: "*fp32" for n in (
                       "PART", "SQ", "BASE", "SCALE", "POST", "COMB", "USQ")} | dict(CNT="*i32", hc_eps="fp32",
                                                                                    norm_eps="fp32"),
                   dict(HAS_NORM=True, LEAD=1, ITERS=20, NP=32, SP=64, BD=512, NBP=8, NBD=2048), 4, 3, ("D",)),
    # ... the default at Flash width (mhc.NORM_ONE_MAX) (the last arriver's norm in one 4096-column step, its loads first)
    "mhc_finish_norm_one": ("mhc_kernels", "_finish_split_kernel",
                            {n: "*bf16" for n in ("X", "NORM_W", "U", "NORMED")} | {n: "*fp32" for n in (
                                "PART", "SQ", "BASE", "SCALE", "POST", "COMB", "USQ")} | dict(CNT="*i32", hc_eps="fp32",
                                                                                         norm_eps="fp32"),
                            dict(HAS_NORM=True, LEAD=1, ITERS=20, NP=32, SP=64, BD=512, NBP=8, NBD=4096,
                                 NORM_ONE=True), 4, 3, ("D",)),
    # the "row" finish at prefill width (Flash: one 4096-column chunk on 4 warps, the norm from registers)
    "mhc_finish_row": ("mhc_kernels", "_finish_kernel",
                       {n: "*bf16" for n in ("X", "NORM_W", "U", "NORMED")} | {n: "*fp32" for n in (
                           "PART", "SQ", "BASE", "SCALE", "POST", "COMB")} | dict(hc_eps="fp32", norm_eps="fp32"),
                       dict(HAS_NORM=True, ITERS=20, NP=32, SP=2, BD=4096, ONE_PASS=True), 4, 3, ("D",)),
    "align_prefix": ("moe_align", "_block_prefix_kernel", dict(COUNTS="*i32", PREFIX="*i32", TOTALS="*i32"),
                     dict(E_POW2=256, ES=32, BB=64), 4, 3, ()),
    "align_scatter": ("moe_align", "_block_scatter_kernel",
                      dict(TOPK="*i32", SORTED="*i32", PREFIX="*i32", TOTALS="*i32", EXPERT_IDS="*i32",
                           NUM_POST="*i32"),
                      dict(BM=64, E_POW2=256, CHUNK=512, SCATTER=32, BLOCK_B=32), 8, 3, ()),
    "norm_rope_two": ("norm_rope", "_norm_rope_two_kernel",
                      {n: "*bf16" for n in ("X", "OUT", "W", "H", "X2", "OUT2", "W2", "H2")}
                      | {n: "*fp32" for n in ("COS", "SIN", "COS2", "SIN2")}
                      | {n: "fp32" for n in ("eps", "hscale", "eps2", "hscale2")},
                      dict(D=512, DP=512, ROPE0=448, NOPE=0, NORM=2, ROT=True, INV=False, SIM=0, BR=1,
                           D2=128, DP2=128, ROPE0_2=64, NOPE2=0, NORM2=0, ROT2=True, INV2=False, SIM2=2, BR2=64,
                           INTERP=False, RF=False), 4, 3, ()),  # (RF: norm_rope.ROPE_FIRST, off where BR2 > 1)
    # the decode step's q latent + window kv with the kv's store into the FP8 window pool (attention.FUSED_KV_STORE)
    "norm_rope_two_store": ("norm_rope", "_norm_rope_two_kernel",
                            {n: "*bf16" for n in ("X", "OUT", "W", "H", "X2", "OUT2", "W2", "H2", "SR")}
                            | {n: "*fp32" for n in ("COS", "SIN", "COS2", "SIN2")}
                            | {n: "fp32" for n in ("eps", "hscale", "eps2", "hscale2")}
                            | dict(PAGE="*i64", OFF="*i64", SQ="*fp8e4nv", SS="*u8"),
                            dict(D=1024, DP=1024, ROPE0=1024, NOPE=0, NORM=1, ROT=False, INV=False, SIM=0, BR=1,
                                 D2=512, DP2=512, ROPE0_2=448, NOPE2=448, NORM2=1, ROT2=True, INV2=False, SIM2=1,
                                 BR2=1, INTERP=False, RF=True, STORE2=True), 4, 3, ()),
    "gate_route": ("router", "_gate_route_kernel",
                   dict(X="*bf16", W="*bf16", PART="*fp32", LOGITS="*fp32", CNT="*i32", BIAS="*fp32", T2E="*i32",
                        TOK="*i32", W_OUT="*fp32", ID_OUT="*i32", route_scale="fp32"),
                   dict(D=4096, BN=32, KS=512, S=8, RB=1, E=256, BE=256, K=6, BK=8, P=8, HAS_BIAS=True, HASH=False,
                        NORMALIZE=True, INTERP=False, QX=False), 4, 3, ("stride_x", "stride_w")),
    # ... as Flash's decode runs it (gate_route_config), x also quantised for the routed experts' GLU (x_quant)
    "gate_route_qx": ("router", "_gate_route_kernel",
                      dict(X="*bf16", W="*bf16", PART="*fp32", LOGITS="*fp32", CNT="*i32", BIAS="*fp32", T2E="*i32",
                           TOK="*i32", W_OUT="*fp32", ID_OUT="*i32", XQ="*fp16", SX="*fp32", route_scale="fp32"),
                      dict(D=4096, BN=8, KS=1024, S=4, RB=4, E=256, BE=256, K=6, BK=8, P=8, HAS_BIAS=True,
                           HASH=False, NORMALIZE=True, INTERP=False, QX=True), 4, 3,
                      ("stride_x", "stride_w", "stride_xq", "stride_sx")),
    "topk_chunks": ("topk", "_topk_kernel", dict(S="*bf16", PRESENT="*u8", PICKED="*i64", VALID="*u8"),
                    dict(KEY16=True, INF_BITS=0x7F80, HAS_PRESENT=True, BLOCK=1024), 4, 3, ()),
    # ... storing -1 for absent picks (indexer.MARK_ABSENT: the decode attention's list)
    "topk_chunks_marked": ("topk", "_topk_kernel", dict(S="*bf16", PRESENT="*u8", PICKED="*i64", VALID="*u8"),
                           dict(KEY16=True, INF_BITS=0x7F80, HAS_PRESENT=True, BLOCK=1024, MARK_ABSENT=True), 4, 3, ()),
    # ... the sampled one-program kernel (`topk.SAMPLED`, prefill rows after a long prefix: 4096-entry chunks, 8 warps;
    # N = 16K: a 1,024-entry sample, the list's 2,048-entry chunks; unit-stride rows as at run time)
    "topk_sampled": ("topk", "_topk_sampled_kernel",
                     dict(S="*bf16", PRESENT="*i32", PICKED="*i32", VALID="*u8", LIST="*i32"),
                     dict(KEY16=True, INF_BITS=0x7F80, HAS_PRESENT=False, BLOCK=4096, STRIDE=16, MARK_ABSENT=True,
                          HAS_VISIBLE=True, GROUP=8, SBLOCK=1024, LBLOCK=2048, ss_n=1), 8, 3, ("N", "ss_b", "cap")),
    # ... a row split into slices (`topk.SPLIT_*`): a histogram pass and the select
    "topk_split_hist": ("topk", "_split_hist_kernel", dict(S="*bf16", TOT="*i32", ROWS="*i32", ABOVE="*i32"),
                        dict(PASS=1, INF_BITS=0x7F80, BLOCK=1024), 4, 3, ()),
    "topk_split_select": ("topk", "_split_select_kernel",
                          dict(S="*bf16", TOT="*i32", CNT="*i32", ROWS="*i32", ABOVE="*i32", PRESENT="*u8",
                               PICKED="*i64", VALID="*u8"),
                          dict(INF_BITS=0x7F80, HAS_PRESENT=True, BLOCK=1024, SP=64, MARK_ABSENT=True,
                               HAS_VISIBLE=False), 4, 3, ()),
    "fp8_gemv_wq_a": ("fp8_gemv", "_fp8_gemv_kernel",
                      dict(X="*bf16", W="*fp8e4nv", SW="*u8", C="*bf16", P="*fp32", CNT="*i32"),
                      dict(MR=1, BN=64, KU=4, QUANT_X=True, SW_E8M0=True, SPLIT_OUT=True, OUT_F32=False, PREFETCH=4,
                           ROUND_W=False, INTERP=False), 4, 1, ("stride_xm", "stride_xg", "stride_wn")),
    # the one-token GEMM of wq_b (swap AB, the input quantised inside; 8 K blocks, no split)
    "fp8_gemm_wq_b": ("fp8_linear", "_fp8_gemm_kernel", GEMM_T, GEMM_C, 4, 4, GEMM_DIV16),
    "pool_csa": ("cache_store", "_pool_kernel",
                 dict(C="*fp32", Z="*fp32", PAGE="*i64", SLOTS="*i64", HAS_PREV="*i1", OUT="*fp32", NC="*fp32",
                      NZ="*fp32", NSLOT="*i64"),
                 dict(R=8, RR=8, RATIO=4, DIM=512, OVERLAP=True, BD=128, NEW=True, CHUNK=False), 4, 3,
                 ("stride_p", "stride_s", "stride_o", "stride_n")),
    # ... with the entries' store by each row's last arriver (attention.FUSED_ENTRY_STORE): the indexer's keys
    "pool_csa_store_index": ("cache_store", "_pool_kernel",
                             dict(C="*fp32", Z="*fp32", PAGE="*i64", SLOTS="*i64", HAS_PREV="*i1", OUT="*fp32",
                                  NC="*fp32", NZ="*fp32", NSLOT="*i64", CNT="*i32", SPAGE="*i64", SOFF="*i64",
                                  W="*bf16", COS="*fp32", SIN="*fp32", H="*fp32", SQ="*i8", SS="*u8", SR="*i8",
                                  eps="fp32"),
                             dict(R=8, RR=8, RATIO=4, DIM=128, OVERLAP=True, BD=128, NEW=True, CHUNK=False,
                                  STORE=True, NOPE=128, ROPE0=64, ROT=True, HADAMARD=True, FP4=True), 4, 3,
                             ("stride_p", "stride_s", "stride_o", "stride_n")),
    "pool_chunk_csa": ("cache_store", "_pool_kernel",
                       {n: "*fp32" for n in ("C", "Z", "PAGE", "SLOTS", "HAS_PREV", "OUT", "NC", "NZ", "NSLOT")},
                       dict(R=8, RR=8, RATIO=4, DIM=512, OVERLAP=True, BD=128, NEW=False, CHUNK=True), 4, 3,
                       ("stride_s", "stride_o")),
    "prefill_attn": ("prefill_attention", "_prefill_attn_kernel",
                     dict(Q="*bf16", K="*bf16", E="*bf16", IDX="*i32", SINK="*fp32", OUT="*bf16", COS="*fp32",
                          SIN="*fp32", scale="fp32"),
                     dict(BH=64, D=512, DV=512, BN=64, HAS_E=True, INTERP=False, KV_ONE_LOAD=True, ROT=True, NOPE=448,
                          UNMASKED=True, CAUSAL_R=0),
                     8, 2, ("stride_qt", "stride_qh", "stride_kt", "stride_et", "stride_it", "stride_ot", "stride_oh")),
    "prefill_attn_norot": ("prefill_attention", "_prefill_attn_kernel",
                           dict(Q="*bf16", K="*bf16", E="*bf16", IDX="*i32", SINK="*fp32", OUT="*bf16", COS="*fp32",
                                SIN="*fp32", scale="fp32"),
                           dict(BH=64, D=512, DV=512, BN=64, HAS_E=True, INTERP=False, KV_ONE_LOAD=True, ROT=False,
                                NOPE=448, UNMASKED=True, CAUSAL_R=0),
                           8, 2, ("stride_qt", "stride_qh", "stride_kt", "stride_et", "stride_it", "stride_ot",
                                  "stride_oh")),
    # the same attention in Gluon (explicit asynchronous wgmmas; dsv4.kernels.prefill_attention_gluon); _qnorm: with
    # q's per-head norm + RoPE applied to Q in shared memory (prefill_attention(q_norm=))
    **{name: ("prefill_attention_gluon", "_attn_kernel", GLUON_ATTN_T, dict(GLUON_ATTN_C, **c), 8, 1, GLUON_ATTN_DIV16)
       for name, c in (("prefill_attn_gluon", dict(QNORM=False)), ("prefill_attn_gluon_qnorm", {}),
                       ("prefill_attn_gluon_no_pre", dict(QNORM=False, PRE_IDX=False)))},
    # ... one warpgroup scoring every tile, both multiplying (prefill_attention_scorer: 4 warps + a 4-warp partition)
    **{name: ("prefill_attention_scorer", "_scorer_kernel", GLUON_ATTN_T,
              {**{k: v for k, v in GLUON_ATTN_C.items() if k not in ("STAGES", "PRE_IDX")}, "WORKER_REGS": 232, **c},
              4, 1, GLUON_ATTN_DIV16)
       for name, c in (("prefill_attn_scorer", dict(QNORM=False)), ("prefill_attn_scorer_qnorm", {}))},
    # the Triton wide MoE kernel (moe_wide._wide_kernel: the GPUs other than Hopper's), its GLU
    "moe_wide_triton": ("moe_wide", "_wide_kernel", dict(WIDE_T, C="*bf16"),
                        dict(BM=64, BN=128, GLU=True, USE_ASM=True, INTERP=False, F16=False), 8, 3, WIDE_DIV16),
    # the prefill MoE GLU (Gluon): one warpgroup, 64 weight rows x 128 pairs, weight pairs as stored / permuted
    "moe_glu_wide": ("moe_wide_async", "_wide_async_kernel", WIDE_T, dict(WIDE_C, PERM=0), 4, 1, WIDE_DIV16),
    "moe_glu_wide_perm": ("moe_wide_async", "_wide_async_kernel", WIDE_T, dict(WIDE_C, PERM=2), 4, 1, WIDE_DIV16),
    # ... and its epilogue through shared memory (16-byte stores); the down GEMM (128-row tiles), both epilogues
    "moe_glu_wide_t": ("moe_wide_async", "_wide_async_kernel", WIDE_T, dict(WIDE_C, PERM=2, STORE_T=True), 4, 1,
                       WIDE_DIV16),
    # ... on two warpgroups (128 channels: W2's input quantised in the epilogue), the widened weights in registers
    "moe_glu_wide_2wg": ("moe_wide_async", "_wide_async_kernel", WIDE_T, dict(WIDE_C, PERM=2, STORE_T=True, BN=128,
                                                                               NW=8), 8, 1, WIDE_DIV16),
    "moe_down_wide": ("moe_wide_async", "_wide_async_kernel", WIDE_T, dict(WIDE_C, PERM=0, GLU=False, BN=128), 4, 1,
                      WIDE_DIV16),
    "moe_down_wide_t": ("moe_wide_async", "_wide_async_kernel", WIDE_T,
                        dict(WIDE_C, PERM=0, GLU=False, BN=128, STORE_T=True), 4, 1, WIDE_DIV16),
    # the prefill MoE GLU on FP8 tensor cores (moe_glu_fp8: 128 tokens x 64 channels, two warpgroups)
    "moe_glu_fp8": ("moe_glu_fp8", "_glu_fp8_kernel", GLU_FP8_T, dict(GLU_FP8_C, GLU=True), 8, 1, GLU_FP8_DIV16),
    "moe_down_fp8": ("moe_glu_fp8", "_glu_fp8_kernel", GLU_FP8_T, dict(GLU_FP8_C, GLU=False), 8, 1, GLU_FP8_DIV16),
    # ... warp-specialized: a 4-warp producer (copies, re-encode) and a 4-warp consumer per 64 rows
    **{name: ("moe_fp8_ws", "_glu_fp8_ws_kernel", GLU_FP8_T,
              dict(BM=bm, XSLOTS=6, WSLOTS=3, RAW=4 if np == 1 else 3, GROUP_M=4, LISTED=True, GLU=glu, PRODUCER_WARPS=pw, PRODUCERS=np,
                   PRODUCER_REGS=pr, CONSUMER_REGS=cr), 4, 1, GLU_FP8_DIV16)
       for name, bm, glu, pw, np, pr, cr in (("moe_glu_fp8_ws", 128, True, 4, 1, 152, 176),
                                             ("moe_down_fp8_ws", 128, False, 4, 1, 152, 176),
                                             ("moe_glu_fp8_ws_bm64", 64, True, 4, 1, 152, 176),
                                             ("moe_glu_fp8_ws_p8", 128, True, 8, 1, 96, 160),
                                             ("moe_glu_fp8_ws_2p", 128, True, 4, 2, 96, 160),
                                             ("moe_down_fp8_ws_2p", 128, False, 4, 2, 96, 160),
                                             ("moe_glu_fp8_ws_2p_bm64", 64, True, 4, 2, 88, 168))},
    "moe_glu_fp8_bm64": ("moe_glu_fp8", "_glu_fp8_kernel", GLU_FP8_T, dict(GLU_FP8_C, BM=64, GLU=True), 4, 1,
                         GLU_FP8_DIV16),
    # the indexer's prefill scores [T, N] (an entry count divisible by 16, as Triton specialises it)
    "prefill_scores": ("indexer_scores", "_prefill_scores_kernel",
                       dict(Q="*bf16", W="*fp32", K="*bf16", VIS="*i32", OUT="*bf16"),
                       dict(D=128, BT=64, BN=128, INTERP=False), 4, 3, ("N", "sq_t", "sq_h", "sw_t", "sk_n", "so_t")),
    # ... on folded e4m3 operands (indexer_fp8: FP8 dots, the total times SK), behind the guard that reads OK
    "prefill_scores_fp8": ("indexer_scores", "_prefill_scores_kernel",
                           dict(Q="*fp8e4nv", W="*fp32", K="*fp8e4nv", VIS="*i32", OUT="*bf16", SK="*fp32",
                                OK="*i32"),
                           dict(D=128, BT=64, BN=128, INTERP=False, GUARD=1), 4, 3,
                           ("N", "sq_t", "sq_h", "sw_t", "sk_n", "so_t")),
    # ... in Gluon (indexer_scores.PREFILL_GLUON_MIN_KEYS: the next head's wgmma in flight during a head's rounding)
    "prefill_scores_gluon": ("indexer_scores_gluon", "_scores_kernel",
                             dict(Q="*bf16", W="*bf16", K="*bf16", VIS="*i32", OUT="*bf16"),
                             dict(D=128, BT=64, BN=256, STAGES=4, GROUP=8, EBITS=16), 8, 1,
                             ("N", "stride_qt", "stride_qh", "stride_kn", "stride_ot")),
    "prefill_scores_gluon_fp8": ("indexer_scores_gluon", "_scores_kernel",
                                 dict(Q="*fp8e4nv", W="*fp32", K="*fp8e4nv", VIS="*i32", OUT="*bf16", SK="*fp32",
                                      OK="*i32"),
                                 dict(D=128, BT=64, BN=256, STAGES=4, GROUP=8, EBITS=8, GUARD=1), 8, 1,
                                 ("N", "stride_qt", "stride_qh", "stride_kn", "stride_ot")),
    # the fold of FP4-simulated rows to e4m3 and a power of two per row (indexer_fp8), with the weights
    "indexer_fold": ("indexer_fp8", "_fold_kernel", dict(X="*bf16", W="*bf16", X8="*fp8e4nv", S="*fp32", OK="*i32"),
                     dict(D=128, BR=32, HAS_W=True), 4, 1, ("sx_t", "sx_h")),
    # the requantisation of the MoE's activations / z (16-byte stores also when it permutes the columns)
    "requant": ("moe_wide", "_requant_kernel", dict(Z="*bf16", OUT="*bf16"), dict(BR=32, PERM=0), 4, 1,
                ("stride", "stride_out")),
    "requant_perm": ("moe_wide", "_requant_kernel", dict(Z="*bf16", OUT="*bf16"), dict(BR=32, PERM=2), 4, 1,
                     ("stride", "stride_out")),
    # the decode GLU as a persistent Gluon kernel with a TMA producer warp (moe_glu_decode; Flash: D 4096): one
    # consumer, 4 K ranges (compiled here without the launch's maxnreg=232: ptxas warns and uses 255), two (2 K
    # ranges, a ring of 4 since session 78), and the down GEMV; these under Triton's bound (GLU_BOUND / DOWN_BOUND None)
    "moe_glu_decode": _stream_case(T=32, S=4, KR=1024, R=6, NCONS=1, GLU=True),
    "moe_glu_decode_2c": _stream_case(T=32, S=2, KR=2048, R=4, NCONS=2, GLU=True),
    "moe_down_decode_2c": _stream_case(T=64, S=2, KR=1024, R=6, NCONS=2, GLU=False),
    # ... the down at its default (one K range of 2048, 6 slots)
    "moe_down_decode": _stream_case(T=64, S=1, KR=2048, R=6, NCONS=2, GLU=False),
    # ... under the register bounds GLU_BOUND / DOWN_BOUND ((maxnreg, REGS); maxnreg in OPTIONS): the defaults since
    # session 85 are _b128 (the down) and _b136 (the GLU)
    "moe_down_decode_b160": _stream_case(T=64, S=1, KR=2048, R=6, NCONS=2, GLU=False),
    "moe_down_decode_b128": _stream_case(T=64, S=1, KR=2048, R=6, NCONS=2, GLU=False, REGS=136),
    "moe_glu_decode_b136": _stream_case(T=32, S=2, KR=2048, R=4, NCONS=2, GLU=True, REGS=184),
    # ... the down (default bound) finishing z from the GLU's 4 partials itself (FINISH_IN_DOWN, opt-in)
    "moe_down_decode_fin": _stream_case(T=64, S=1, KR=2048, R=6, NCONS=2, GLU=False, REGS=136, NR=4),
    # ... and the GLU's units in runs of 8 row tiles of one pair (LONG_UNIT_RUN, opt-in from 48 pairs)
    "moe_glu_decode_run8": _stream_case(T=32, S=2, KR=2048, R=4, NCONS=2, GLU=True, RUN=8),
    "moe_glu_finish": ("moe_glu_decode", "_finish_kernel",
                       dict(P="*fp32", IDS="*i32", TOPK_W="*fp32", ZQ="*fp16", ZS="*fp32", limit="fp32"), dict(S=4), 4,
                       1, ("I", "stride_ps", "stride_pp", "stride_zq", "stride_zs")),
    "moe_down_b1": ("moe_gemv", "_mma_down_kernel", DOWN_B1_T, dict(DOWN_B1_C, SCALE_WORDS=False), 4, 3,
                    DOWN_B1_DIV16),
    "moe_down_b1_words": ("moe_gemv", "_mma_down_kernel", DOWN_B1_T, dict(DOWN_B1_C, SCALE_WORDS=True), 4, 3,
                          DOWN_B1_DIV16),
    # ... 2 K blocks per dot (Pro's one-pair down, moe_config.GEMV_ONE_DOWN_DOT_BLOCKS_BY_HIDDEN)
    "moe_down_b1_kd2": ("moe_gemv", "_mma_down_kernel", DOWN_B1_T, dict(DOWN_B1_C, KD=2, SCALE_WORDS=True), 4, 3,
                        DOWN_B1_DIV16),
    # ... two pairs per program (Flash M = 12-64), session 79's launches: 2 K blocks per dot at 3 stages (to 1.55
    # pairs per touched expert), 1 block at 2 stages (above); session 18's 1 block at 3 stages is the _pairs case
    "moe_glu_pairs": ("moe_gemv", "_mma_glu_kernel", GLU_B1_T, dict(GLU_B1_C, SPLIT=False, G=2, SCALE_WORDS=True), 4,
                      3, GLU_B1_DIV16),
    "moe_glu_pairs_kd2": ("moe_gemv", "_mma_glu_kernel", GLU_B1_T,
                          dict(GLU_B1_C, SPLIT=False, G=2, KD=2, SCALE_WORDS=True), 4, 3, GLU_B1_DIV16),
    "moe_glu_pairs_s2": ("moe_gemv", "_mma_glu_kernel", GLU_B1_T, dict(GLU_B1_C, SPLIT=False, G=2, SCALE_WORDS=True),
                         4, 2, GLU_B1_DIV16),
    "moe_down_pairs": ("moe_gemv", "_mma_down_kernel", DOWN_B1_T, dict(DOWN_B1_C, G=2, SCALE_WORDS=True), 4, 3,
                       DOWN_B1_DIV16),
    "moe_down_pairs_kd2": ("moe_gemv", "_mma_down_kernel", DOWN_B1_T, dict(DOWN_B1_C, G=2, KD=2, SCALE_WORDS=True),
                           4, 3, DOWN_B1_DIV16),
    "moe_down_pairs_s2": ("moe_gemv", "_mma_down_kernel", DOWN_B1_T, dict(DOWN_B1_C, G=2, SCALE_WORDS=True), 4, 2,
                          DOWN_B1_DIV16),
}

_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def _stages(spec, module):
    """A case's num_stages: a number, or "module.FLAG" read from the kernel's module (the launcher's value)."""
    return spec if isinstance(spec, int) else getattr(module, spec.split(".")[1])


def _loops(sass: str, hist: int = 0) -> None:
    """Per loop (a backward branch and the code it jumps over): instructions, MMAs and spill traffic, i.e. the cost
    of one iteration per thread; `hist`: also its most frequent opcodes."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).split(".")[0], m.group(3)))
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = collections.Counter(o for a, o, _ in ins if int(target.group(1), 16) <= a <= addr)
            print(f"    loop {int(target.group(1), 16):#x}..{addr:#x}: {sum(body.values())} instructions; "
                  + ", ".join(f"{o} {body[o]}" for o in ("HGMMA", "HMMA", "LDL", "STL", "LDGSTS", "FMUL", "BAR")))
            if hist:
                print("      " + ", ".join(f"{o} {n}" for o, n in body.most_common(hist)))


# the one-token GEMV under linear_config.GEMV_MAXNREG = 104 (opt-in: one CTA fits beside a persistent GLU CTA)
CASES["fp8_gemv_wq_a_r104"] = CASES["fp8_gemv_wq_a"]
# compile options of a case beyond num_warps / num_stages (a launch's `maxnreg`)
OPTIONS = {"moe_down_decode_b160": {"maxnreg": 160}, "moe_down_decode_b128": {"maxnreg": 128},
           "moe_down_decode_fin": {"maxnreg": 128}, "fp8_gemv_wq_a_r104": {"maxnreg": 104},
           "moe_glu_decode_b136": {"maxnreg": 136}}


def compile_kernel(name: str, stages: int | None = None):
    """Case `name` compiled for sm_90a (no GPU needed): (the compiled kernel, its num_warps, its num_stages)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    mod_name, kernel, types, const, warps, stage_spec, div16 = CASES[name]
    module = importlib.import_module(f"dsv4.kernels.{mod_name}")
    jf = getattr(module, kernel)
    while not isinstance(jf, triton.runtime.jit.JITFunction):  # unwrap pdl_kernel
        jf = jf.fn
    params = inspect.signature(jf.fn).parameters
    names = list(params)
    # constexpr parameters the case leaves out take their defaults, as at a launch (not an i32 argument)
    const = {**{n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty
                and "constexpr" in str(p.annotation)}, **const}
    # pointer parameters defaulting to None that the case does not type are None at a launch too (`if X is not None`)
    const = {**{n: None for n, p in params.items() if p.default is None and n not in types}, **const}
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    attrs = {(j,): [["tt.divisibility", 16]] for j, n in enumerate(names) if sig[n].startswith("*") or n in div16}
    n_stages = stages if stages is not None else _stages(stage_spec, module)
    source = GluonASTSource if isinstance(jf, GluonJITFunction) else ASTSource  # (Gluon: layouts are explicit)
    k = triton.compile(source(fn=jf, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": n_stages, **OPTIONS.get(name, {})})
    return k, warps, n_stages


def global_accesses(ptx: str):
    """Counter of the PTX's global loads and stores by width (`st.global.v4.b32`, `st.global.b16`, ...)."""
    return collections.Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*)", ptx))


def ptxas_report(k) -> tuple[str, str]:
    """A compiled kernel's PTX through Triton's own ptxas -v (sm_90a) and cuobjdump: (ptxas's report, the SASS)."""
    import triton.backends.nvidia as nv

    bindir = os.path.join(os.path.dirname(nv.__file__), "bin")
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(k.asm["ptx"])
        info = subprocess.run([os.path.join(bindir, "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", cubin],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", cubin], capture_output=True,
                              text=True).stdout
    return info, sass


def compile_case(name: str, stages: int | None, layouts: bool, loops: bool = False, hist: int = 0,
                 grep: str | None = None, widths: bool = False, room: bool = False) -> None:
    k, warps, n_stages = compile_kernel(name, stages)
    info, sass = ptxas_report(k)
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    ops = collections.Counter(m.group(1).split(".")[0] for m in _OP.finditer(sass))
    print(f"{name:20s} warps {warps} stages {n_stages}: {regs.group(1) if regs else '?'} registers, "
          f"{spill.group(1) if spill else '?'} B spilled, {sum(ops.values())} SASS instructions; "
          + ", ".join(f"{op} {n}" for op, n in ops.most_common(8)))
    for warning in re.findall(r".*(?:warning|Performance Loss).*", info):  # e.g. every wgmma serialised (C7514)
        print("    ptxas: " + warning.strip()[:240])
    if room:  # what one CTA holds of an SM (H100 / H200: 65,536 registers, 228 KB shared) and what fits beside it
        ntid = re.search(r"\.reqntid (\d+)", k.asm["ptx"])
        threads = int(ntid.group(1)) if ntid else 32 * warps
        held = -(-int(regs.group(1)) // 8) * 8 * threads  # (registers are allocated in steps of 8 per thread)
        print(f"    one CTA: {threads} threads x {regs.group(1)} registers = {held:,} of 65,536 ({65536 - held:,} left "
              f"beside it), {k.metadata.shared:,} B shared memory")
    if widths:  # global loads / stores by width (a 16-bit store where 16-byte ones were meant: session 32)
        print("    " + ", ".join(f"{op} {n}" for op, n in global_accesses(k.asm["ptx"]).most_common()))
    if loops:
        _loops(sass, hist)
    if grep:  # the SASS lines themselves (address, instruction) that match
        for line in sass.splitlines():
            if re.search(grep, line):
                print("    " + line.strip()[:140])
    if layouts:
        ttgir = k.asm["ttgir"]
        defs = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
        for m in re.finditer(r"= tt\.load .*?: tensor<(.+?), (#\w+)>", ttgir):
            print(f"    load {m.group(1):28s} {defs.get(m.group(2), m.group(2))[:110]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"cases (default all): {', '.join(CASES)}")
    ap.add_argument("--layouts", action="store_true", help="also print the layout of each global load")
    ap.add_argument("--loops", action="store_true", help="also print each loop's instructions per iteration")
    ap.add_argument("--stages", type=int, default=None, help="num_stages for every case (default: each case's)")
    ap.add_argument("--hist", type=int, default=0, help="with --loops: each loop's N most frequent opcodes")
    ap.add_argument("--widths", action="store_true", help="also count the PTX's global loads / stores by width")
    ap.add_argument("--grep", default=None, help="also print the SASS lines matching this regex")
    ap.add_argument("--room", action="store_true", help="also print the registers one CTA holds of an SM")
    args = ap.parse_args()
    for name in args.names or CASES:
        if name not in CASES:
            raise SystemExit(f"sass_stats: unknown case {name!r}; cases: {', '.join(CASES)}")
        compile_case(name, args.stages, args.layouts, args.loops, args.hist, args.grep, args.widths, args.room)


if __name__ == "__main__":
    main()
