"""Global store widths of kernels whose stores must stay 16-byte vectors, from their PTX compiled offline for
sm_90a (no GPU: `bench/sass_stats.py`'s cases). Session 31 computed the requantisation's store addresses per
element and the compiler split the stores into 16-bit ones: the MoE call went 6.9 -> 8.9 ms at 8K tokens and no
CPU test saw it. Session 32 made the Gluon MoE epilogue store 16 bytes per thread (`ASYNC_STORE_T`)."""

from __future__ import annotations

import os
import sys

import pytest

triton = pytest.importorskip("triton")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _stores(case: str):
    from bench.sass_stats import compile_kernel, global_accesses

    try:
        k, _, _ = compile_kernel(case)
    except (ImportError, RuntimeError, FileNotFoundError) as err:  # a triton without its NVIDIA backend / ptxas
        pytest.skip(f"cannot compile {case} for sm_90a here: {err}")
    return {op: n for op, n in global_accesses(k.asm["ptx"]).items() if op.startswith("st.")}


@pytest.mark.parametrize("case", ["requant", "requant_perm"])
def test_requant_stores_are_16_byte_vectors(case):
    """Rows x one 128-wide block in bf16, 4 warps: every store a v4.b32, with and without the column permutation."""
    assert _stores(case) == {"st.global.v4.b32": 4}, case


@pytest.mark.parametrize("case", ["prefill_scores", "prefill_scores_fp8"])
def test_prefill_index_scores_store_16_byte_vectors(case):
    """The indexer's prefill scores with an entry count divisible by 16 store 16-byte vectors: both the -inf fill of
    unseen tiles and the scores. (Other counts compile to 16-bit stores; rows padded to 16 entries, session 32's
    `PAD_ROWS`, measured no faster, s33a / s33e: 8-layer prefill of 8,004 tokens 102 / 102 ms without, 103 / 102
    with, and were removed.)"""
    assert set(_stores(case)) == {"st.global.v4.b32"}


@pytest.mark.parametrize("case,vectors", [("moe_glu_wide_t", 8), ("moe_down_wide_t", 16)])
def test_gluon_moe_epilogue_stores_16_bytes_per_thread(case, vectors):
    """The finished [channels, pairs] tile moved to 8 channels per thread (`store_tile`'s STORE_T): GLU 64 x 128
    bf16 and down 128 x 128 bf16 per 128 threads, only v4.b32 stores; the accumulator-layout store (STORE_T off,
    the WS kernels' path) is kept as the contrast."""
    assert _stores(case) == {"st.global.v4.b32": vectors}, case
    assert "st.global.b16" in _stores(case.removesuffix("_t")), "the contrast case changed: re-check this test"


# Cases whose narrow (8 / 16-bit) global stores are the data's own shape, with the most the PTX may hold. Any other
# case, or more narrow stores than listed, fails `test_no_new_narrow_stores`: look at the store before raising a bound.
NARROW_ALLOWED = {
    "indexer_scores": (1, "decode: one bf16 score per thread"),
    "indexer_scores_topk": (5, "the scores' bf16, the counter reset, the picks' scattered int64 indices and uint8 "
                               "valid flags (`topk.topk_row`)"),
    "store_indexer": (2, "the MXFP4 key's packed bytes and its scale bytes, one token row"),
    "pool_csa_store_index": (2, "as store_indexer: its last arriver stores the pooled key row (the same function)"),
    "norm_rope_two_store": (9, "one window kv row per program into the FP8 pool: e4m3 code bytes, scale bytes, bf16 "
                               "rope dims (`cache_store.store_row`'s FP8 path)"),
    "mhc_rows_post": (4, "decode: one bf16 element per thread of a token row"),
    "mhc_rows_post_fn_early": (4, "the same kernel with mhc.ROWS_FN_EARLY"),
    "mhc_rows_post_combine": (4, "the same kernel summing a deferred MoE combine (block.COMBINE_IN_NEXT_SITE)"),
    "moe_glu_b1": (1, "decode GEMV: one bf16 output per thread"),
    "moe_down_b1": (1, "decode GEMV: one bf16 output per thread"),
    "moe_glu_b1_words": (1, "as moe_glu_b1"),
    "moe_down_b1_words": (1, "as moe_down_b1"),
    "moe_down_b1_kd2": (1, "as moe_down_b1 (2 K blocks per dot: Pro's one-pair down)"),
    **{f"moe_{g}_pairs{v}": (2, "decode GEMV with two pairs per program: one bf16 output per thread and pair")
       for g in ("glu", "down") for v in ("", "_kd2", "_s2")},
    "topk_chunks": (8, "one valid byte per picked slot"),
    "topk_chunks_marked": (8, "as topk_chunks"),
    "topk_sampled": (32, "as topk_chunks, 16 slots a thread at 4096-entry chunks, in both select paths"),
    "topk_split_select": (8, "as topk_chunks (a row's slice: `topk._split_select_kernel`)"),
    "moe_glu_finish": (1, "z's f16 e4m3 codes scattered in `_act_pos` order (as `_quant16_kernel`)"),
    "gate_route_qx": (1, "x's f16 e4m3 codes scattered in `moe_mma_operands._act_pos` order (as `_quant16_kernel`)"),
    "fp8_gemv_wq_a": (1, "decode GEMV: one bf16 output per thread"),
    "fp8_gemv_wq_a_r104": (1, "the same GEMV under a register cap"),
    "moe_glu_wide": (64, "STORE_T off: the accumulator layout (the WS kernels' epilogue)"),
    "moe_glu_wide_perm": (64, "STORE_T off, as moe_glu_wide"),
    "moe_down_wide": (128, "STORE_T off, as moe_glu_wide"),
}


def _cases():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from bench.sass_stats import CASES

    return list(CASES)


@pytest.mark.parametrize("case", _cases())
def test_no_new_narrow_stores(case):
    """Every `bench/sass_stats.py` case (the kernels whose SASS the sessions track), compiled for sm_90a: no 8 / 16-bit
    global stores beyond NARROW_ALLOWED's bound for it (none for the rest)."""
    narrow = sum(n for op, n in _stores(case).items() if op.rsplit(".", 1)[-1] in ("b8", "b16", "u8", "u16"))
    bound = NARROW_ALLOWED.get(case, (0, ""))[0]
    assert narrow <= bound, f"{case}: {narrow} narrow global stores (allowed {bound}): {_stores(case)}"

