"""The FP8 linear's launch-shape heuristic (`dsv4.kernels.linear_config`), checked as the documented rule:
per regime of M the tile shape, and a K split that is the largest power of two keeping the grid within
its program budget and every split at its minimum number of K blocks. Plain Python, no GPU."""

import random

import pytest

from dsv4.kernels.linear_config import NUM_SMS_H200, LinearConfig, launch_split, pick_linear_config

FLASH = [(1024, 4096), (512, 4096), (1536, 4096), (32768, 1024), (4096, 8192), (4096, 4096), (4096, 2048),
         (8192, 1024), (40960, 1024)]
PRO = [(1536, 7168), (512, 7168), (65536, 1536), (7168, 16384), (6144, 7168), (7168, 3072), (8192, 1536),
       (7168, 7168)]
MS = [1, 2, 7, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 200, 255, 512, 1024, 1025, 4096]


def _regime(m: int) -> tuple[dict, int, int]:
    """Expected tile fields, program budget and minimum K blocks per split, from the docstring."""
    if m <= 16:
        return dict(bm=16, bn=128, swap_ab=True, fuse_quant=True, num_warps=4), 2 * NUM_SMS_H200, 4
    if m <= 64:
        return dict(bm=32 if m <= 32 else 64, bn=64, swap_ab=True, fuse_quant=False), 2 * NUM_SMS_H200, 8
    if m <= 1024:
        return dict(bm=64, bn=128, swap_ab=False, fuse_quant=False, num_warps=4), NUM_SMS_H200, 8
    return dict(bm=128, bn=128, swap_ab=False, fuse_quant=False, num_warps=8), NUM_SMS_H200, 8


def _fits(tiles: int, kblocks: int, split: int, programs: int, min_kb: int) -> bool:
    return tiles * split <= programs and kblocks % split == 0 and kblocks // split >= min_kb


@pytest.mark.parametrize("m", MS)
def test_pick_follows_the_documented_rule(m):
    want, programs, min_kb = _regime(m)
    for n, k in FLASH + PRO:
        cfg = pick_linear_config(m, n, k)
        assert {f: getattr(cfg, f) for f in want} == want, (m, n, k)
        kblocks = k // 128
        tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
        s = cfg.split_k
        assert s >= 1 and s & (s - 1) == 0, (m, n, k, s)
        if s > 1:
            assert _fits(tiles, kblocks, s, programs, min_kb), (m, n, k, s)
        assert not _fits(tiles, kblocks, 2 * s, programs, min_kb), f"{m, n, k}: split {s} could double"
        assert launch_split(m, n, k, cfg) == s  # the launch uses the picked split as is


def test_worked_examples():
    """By hand: Flash wo_b (4096 x 8192, 64 K blocks) at M = 64: 64 tiles of 64 rows, 64 * 4 = 256 <= 264 with 16
    K blocks per split, 64 * 8 > 264: split 4 (the sweep's winner). At M = 1: 32 tiles of 128 rows, 32 * 8 = 256
    <= 264 with 8 blocks per split: 8. At M = 128: 2 x 32 tiles of 64x128 within one wave (132): 2. Flash wq_b
    (32768 x 1024) never splits: 256 or 512 tiles."""
    assert pick_linear_config(64, 4096, 8192).split_k == 4
    assert pick_linear_config(1, 4096, 8192).split_k == 8
    assert pick_linear_config(128, 4096, 8192).split_k == 2
    assert {pick_linear_config(m, 32768, 1024).split_k for m in (1, 8, 64, 128)} == {1}


def test_explicit_split_is_lowered_to_a_divisor():
    rng = random.Random(13)
    for _ in range(200):
        kblocks = rng.randint(1, 130)
        split = rng.randint(1, 40)
        cfg = LinearConfig(bm=16, bn=64, swap_ab=True, fuse_quant=True, split_k=split)
        s = launch_split(1, 1024, 128 * kblocks, cfg)
        assert 1 <= s <= split and kblocks % s == 0
        assert all(kblocks % d for d in range(s + 1, min(split, kblocks) + 1)), (kblocks, split, s)
