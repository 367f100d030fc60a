"""Launch shapes of the FP8 block linear's Triton GEMM (`dsv4.kernels.fp8_linear`): `LinearConfig`, the
heuristic `pick_linear_config` and the K split a launch uses. Plain Python: the CPU side (the stacked
launches of `dsv4.model.linear`) needs the same numbers without triton."""

from __future__ import annotations

from dataclasses import dataclass, replace

BLOCK = 128
NUM_SMS_H200 = 132


@dataclass(frozen=True)
class LinearConfig:
    """One launch shape of `fp8_linear._fp8_gemm_kernel` (the two shapes: `dsv4.kernels.fp8_linear`'s docstring)."""

    bm: int
    bn: int
    swap_ab: bool
    fuse_quant: bool
    split_k: int = 1  # 0 = choose from the grid size
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 4


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def pick_linear_config(m: int, n: int, k: int, groups: int = 1) -> LinearConfig:
    """Heuristic launch shape for an [m, k] x [n, k]^T product, K split chosen here (H200 sweeps,
    `bench/sweep_linear.py`, docs/benchmarks.md session 13).

    M <= 16: swap AB (128 weight rows x 16 tokens) with the activation quantised inside the GEMM.
    16 < M <= 64: swap AB on pre-quantised activations, 64 weight rows per tile, so that a wide K splits
    over more programs (Flash wo_b at M = 64: 41.9 -> 19.8 µs against 64x128 tiles without a split).
    M > 64: 64x128 tiles up to M = 1024, 128x128 with 8 warps beyond, at most one wave after the split
    (these programs hold more in flight; two waves measured slower, e.g. Flash sh_w13 at M = 128).
    """
    kblocks = k // BLOCK
    if m <= 16:
        cfg, programs, min_kb = LinearConfig(bm=16, bn=128, swap_ab=True, fuse_quant=True), 2 * NUM_SMS_H200, 4
    elif m <= 64:
        cfg = LinearConfig(bm=_next_pow2(m), bn=64, swap_ab=True, fuse_quant=False)
        programs, min_kb = 2 * NUM_SMS_H200, 8
    elif m <= 1024:
        cfg, programs, min_kb = LinearConfig(bm=64, bn=128, swap_ab=False, fuse_quant=False), NUM_SMS_H200, 8
    else:
        cfg = LinearConfig(bm=128, bn=128, swap_ab=False, fuse_quant=False, num_warps=8)
        programs, min_kb = NUM_SMS_H200, 8
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * groups
    return replace(cfg, split_k=_auto_split(tiles, kblocks, programs, min_kb))


def _auto_split(tiles: int, kblocks: int, programs: int = 2 * NUM_SMS_H200, min_kblocks: int = 2) -> int:
    """The largest power-of-two K split that keeps the grid within `programs` and every split at
    `min_kblocks` or more K blocks (weight streaming needs enough programs in flight; each split adds
    an fp32 partial tile to write and sum)."""
    split = 1
    while (tiles * split * 2 <= programs and kblocks % (split * 2) == 0
           and kblocks // (split * 2) >= min_kblocks):
        split *= 2
    return split


def launch_split(m: int, n: int, k: int, cfg: LinearConfig, groups: int = 1) -> int:
    """The K split a launch of `cfg` over an [m, k] x [n, k]^T product uses: the config's own, else
    `_auto_split` of its grid, lowered until every split gets the same number of K blocks. Two launches
    with the same config and split compute every output element the same way. Plain Python (callers
    without triton use it too)."""
    kblocks = k // BLOCK
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * groups
    split = cfg.split_k if cfg.split_k > 0 else _auto_split(tiles, kblocks)
    while kblocks % split:
        split -= 1
    return split
