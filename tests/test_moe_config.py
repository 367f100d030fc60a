"""The MoE launch-shape rule (dsv4.kernels.moe_config.pick_moe_config) picks the kernels the H200 sweeps
measured fastest (docs/benchmarks.md #5): per-pair kernels at decode sizes (GLU split-K only while the pairs
leave SMs idle; blocks of 2 or 4 pairs of an expert per program from B = 8 to 128 on Flash), the bf16-wgmma
kernel past them (16-token tiles to 12 pairs per expert, 32 to 24, then 64-row tiles, 128-row from 64 pairs per
expert, mixed with 64-row ones from 128); the per-group grouped GEMM where the wide kernel cannot run."""

from __future__ import annotations

import math

import pytest

from dsv4.kernels.moe_config import (GEMV_PAIRED_DOT1_STAGES, GEMV_PAIRED_DOT2_MAX, GEMV_PAIRED_FROM,
                                     GEMV_PAIRED_MAX, GEMV_SPLIT_MAX_PAIRS,
                                     MIXED_MIN_PAIRS_PER_EXPERT, PER_GROUP_MAX_PAIRS_PER_EXPERT,
                                     WIDE16_MAX_PAIRS_PER_EXPERT, WIDE32_MAX_PAIRS_PER_EXPERT,
                                     WIDE64_MIN_PAIRS_PER_EXPERT, WIDE_MIN_PAIRS_PER_EXPERT, per_group_config,
                                     pick_moe_config)

FLASH_E, PRO_E, TOP_K = 256, 384, 6


@pytest.mark.parametrize("experts", [FLASH_E, PRO_E])
@pytest.mark.parametrize("tokens", [1, 2, 8, 32, 64, 128, 256, 1024, 2048, 4096, 8192])
def test_regimes(experts, tokens):
    pairs = tokens * TOP_K
    cfg = pick_moe_config(pairs, experts)
    per_expert = pairs / min(pairs, experts)
    per_touched = pairs / (experts * (1 - math.exp(-pairs / experts)))
    if per_touched < GEMV_PAIRED_FROM:  # decode: one program per (pair, row tile) (hidden unknown: Flash's bounds)
        assert cfg.gemv and cfg.gemv_mma and not cfg.wide and cfg.gemv_pairs == 1
        assert cfg.gemv_split == (2 if pairs <= GEMV_SPLIT_MAX_PAIRS else 1)
    elif per_touched <= GEMV_PAIRED_MAX:  # 2 or 4 pairs of an expert per program, no split, <= 16 MMA columns
        assert cfg.gemv and cfg.gemv_mma and cfg.gemv_pairs in (2, 4) and cfg.gemv_split == 1
        assert 4 * cfg.gemv_pairs * cfg.gemv_unroll == 16
        dot2 = cfg.gemv_pairs == 2 and per_touched <= GEMV_PAIRED_DOT2_MAX  # (hidden unknown: Flash's bound)
        assert (cfg.gemv_dot_blocks, cfg.gemv_stages) == ((2, 3) if dot2 else
                                                          (1, GEMV_PAIRED_DOT1_STAGES if cfg.gemv_pairs == 2 else 3))
    elif per_expert <= WIDE32_MAX_PAIRS_PER_EXPERT:  # the wide kernel's 16- or 32-token tiles
        assert cfg.wide and cfg.bm == (16 if per_expert <= WIDE16_MAX_PAIRS_PER_EXPERT else 32)
        assert cfg.bn1 == 128 and not cfg.gemv and not cfg.mixed
    elif per_expert >= WIDE_MIN_PAIRS_PER_EXPERT:
        assert cfg.wide and cfg.bm == 128 and cfg.bn1 == 128 and not cfg.gemv
        assert cfg.mixed == (per_expert >= MIXED_MIN_PAIRS_PER_EXPERT)
    elif per_expert >= WIDE64_MIN_PAIRS_PER_EXPERT:
        assert cfg.wide and cfg.bm == 64 and cfg.bn1 == 128 and not cfg.gemv
    else:
        assert not cfg.wide and not cfg.gemv
    assert not cfg.mixed or cfg.wide
    assert cfg.bn1 == 128 or not cfg.quant_out  # a fused z quantisation needs one 128-wide block per tile


def test_thresholds_match_the_measured_crossovers():
    """Flash: B = 1 (6 pairs) splits, B = 8 to 11 take one pair per program and no split (session 78), B = 12 blocks
    of pairs; Pro keeps blocks of pairs from B = 16 (1.13 pairs per touched expert of its 384); M = 4096 (96 pairs
    per expert) takes the wide kernel's 128-row tiles, smaller M smaller tiles."""
    b1 = pick_moe_config(6, FLASH_E)
    assert b1.gemv_split == 2
    assert [(c.gemv_pairs, c.gemv_split) for c in (pick_moe_config(b * TOP_K, FLASH_E, hidden=4096) for b in
                                                   (8, 11, 12))] == [(1, 1), (1, 1), (2, 1)]
    assert pick_moe_config(16 * TOP_K, PRO_E, hidden=7168).gemv_pairs == 2
    assert pick_moe_config(16 * TOP_K, PRO_E, hidden=4096).gemv_pairs == 1  # (the bound is Pro's hidden size's)
    # two pairs per program: 2 K blocks per dot on Flash to M = 40 (1.54 per touched expert), 2 stages from 41 (s79);
    # Pro 2 K blocks per dot over its whole two-pair range (to 2.3 per touched expert, M = 126)
    launch = {b: (c.gemv_pairs, c.gemv_dot_blocks, c.gemv_stages) for b in (12, 40, 41, 64)
              for c in [pick_moe_config(b * TOP_K, FLASH_E, hidden=4096)]}
    assert launch == {12: (2, 2, 3), 40: (2, 2, 3), 41: (2, 1, 2), 64: (2, 1, 2)}
    assert {(c.gemv_pairs, c.gemv_dot_blocks) for b in (16, 64, 126)
            for c in [pick_moe_config(b * TOP_K, PRO_E, hidden=7168)]} == {(2, 2)}
    # one pair per program: Pro's Triton down takes 2 K blocks per dot (s80a), Flash's one-pair downs the GLU's launch
    assert {pick_moe_config(b * TOP_K, PRO_E, hidden=7168).gemv_down_dot_blocks for b in (1, 2, 4, 8)} == {2}
    assert {pick_moe_config(b * TOP_K, FLASH_E, hidden=h).gemv_down_dot_blocks for b in (1, 8, 12, 64)
            for h in (4096, 0)} | {pick_moe_config(16 * TOP_K, PRO_E, hidden=7168).gemv_down_dot_blocks} == {0}
    assert pick_moe_config(4096 * TOP_K, FLASH_E).wide and not pick_moe_config(4096 * TOP_K, FLASH_E).mixed
    assert pick_moe_config(8192 * TOP_K, FLASH_E).mixed  # M = 8192 (192 per expert): 128- and 64-row tiles
    # past the per-pair kernels (session 66): 16-token tiles up to M = 512 (12 per expert), 32-token tiles up to
    # M = 1024 (24 per expert), 64-row tiles at M = 1536 and 2048
    ms = (192, 256, 384, 512, 640, 768, 1024, 1536, 2048)
    assert [pick_moe_config(m * TOP_K, FLASH_E).bm for m in ms] == [16, 16, 16, 16, 32, 32, 32, 64, 64]
    assert all(pick_moe_config(m * TOP_K, FLASH_E).wide for m in ms)
    assert not pick_moe_config(4096 * TOP_K, FLASH_E, act="bf16").wide  # W4A16 option: not the wide kernel
    # blocks of pairs from B = 12 to B = 128 (the session-18 sweeps, session 78's lower bound): two up to B = 64,
    # four (one K block per loop step) at B = 96 and 128; one pair at B = 1, 4 and 8, the per-group kernel from 192
    flash = [pick_moe_config(b * TOP_K, FLASH_E) for b in (1, 4, 8, 16, 64, 96, 128)]
    assert [c.gemv_pairs for c in flash] == [1, 1, 1, 2, 2, 4, 4]
    assert [c.gemv_unroll for c in flash] == [2, 2, 2, 2, 2, 1, 1]
    assert not pick_moe_config(192 * TOP_K, FLASH_E).gemv


def test_blocks_of_pairs_fit_rule():
    """fused_moe runs a config's blocks of pairs only where they fit: at most 32 MMA columns (4 per pair and K block
    of a loop step), no split, at most MAX_PAIRS pairs for the one-program pairing; else one pair per program."""
    import dataclasses

    from dsv4.kernels.moe_gemv import pairs_fit
    from dsv4.kernels.moe_gemv_pairs import MAX_PAIRS

    cfg = pick_moe_config(64 * TOP_K, FLASH_E)
    assert cfg.gemv_pairs == 2 and pairs_fit(cfg, 4096, 2048, 64 * TOP_K)
    assert pairs_fit(cfg, 512, 128, 64 * TOP_K)  # one K block of inter: 8 columns in the down GEMM
    assert not pairs_fit(cfg, 4096, 2048, MAX_PAIRS + 1)
    assert not pairs_fit(dataclasses.replace(cfg, gemv_split=2), 4096, 2048, 64)
    assert not pairs_fit(dataclasses.replace(cfg, gemv_pairs=4, gemv_unroll=4), 4096, 2048, 64)
    assert pairs_fit(dataclasses.replace(cfg, gemv_pairs=4, gemv_unroll=2), 4096, 2048, 64)  # 32 columns
    assert not pairs_fit(dataclasses.replace(cfg, gemv_mma=False), 4096, 2048, 64)


@pytest.mark.parametrize("per_expert", [2, 4.5, 8, 9, 12, 30, 100])
@pytest.mark.parametrize("experts", [FLASH_E, PRO_E])
def test_per_group_fallback(per_expert, experts):
    """Where a wide config cannot run (FP8 experts, MXFP4 scales past `wide_ok`), fused_moe runs the per-group kernel
    at the shape it took before the wide kernel's 16-token tiles: 16-row tiles up to PER_GROUP_MAX_PAIRS_PER_EXPERT
    pairs per expert, else 64-row tiles with 8 warps."""
    pairs = int(per_expert * experts)
    cfg = per_group_config(pairs, experts)
    assert not cfg.wide and not cfg.gemv
    small = pairs / experts <= PER_GROUP_MAX_PAIRS_PER_EXPERT
    assert (cfg.bm, cfg.warps1) == ((16, 4) if small else (64, 8))
    assert cfg.quant_out and not per_group_config(pairs, experts, act="bf16").quant_out


def test_pro_width_takes_the_tiles_sooner():
    """Pro's experts (7168 wide) leave the blocks of pairs at 2.3 pairs per touched expert (s66e: M = 128-224 faster
    on the wide kernel's 16-token tiles); Flash's keep them up to 4 (M = 160 still faster on them), and so does an
    unknown width. Below the bound Pro keeps its blocks of pairs."""
    for m in (128, 160, 192, 224):
        pro = pick_moe_config(m * TOP_K, PRO_E, hidden=7168)
        assert pro.wide and pro.bm == 16 and not pro.gemv
        assert pick_moe_config(m * TOP_K, PRO_E).gemv  # the default bound without the width
    for m in (128, 144, 160):
        assert pick_moe_config(m * TOP_K, FLASH_E, hidden=4096).gemv
    assert pick_moe_config(64 * TOP_K, PRO_E, hidden=7168).gemv_pairs == 2  # 1.4 per touched expert
