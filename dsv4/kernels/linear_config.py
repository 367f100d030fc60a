"""Launch shapes of the FP8 block linear's Triton kernels: `LinearConfig` / `pick_linear_config` and the K
split of the tensor-core GEMM (`dsv4.kernels.fp8_linear`), `GemvConfig` / `pick_gemv_config` of the one-token
CUDA-core GEMV (`dsv4.kernels.fp8_gemv`). Plain Python: the CPU side (the stacked launches of
`dsv4.model.linear`) needs the same numbers without triton."""

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


# The decode (M <= 16) GEMM's K split: the grid at most DECODE_PROGRAMS programs, each at least DECODE_MIN_KBLOCKS K
# blocks (Flash at one token: wq_b 256 programs x 8 blocks, no split; wo_b 32 tiles x 8 splits of 8 blocks). Module
# names so that the 8-layer rows can A/B other splits (`run_device_s83d.sh`: min 16 -> wo_b 4 splits of 16 blocks;
# 4 x 132 programs -> wo_b 16 of 4, wq_b 2 of 4).
DECODE_PROGRAMS = 2 * NUM_SMS_H200
DECODE_MIN_KBLOCKS = 4


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
        cfg = LinearConfig(bm=16, bn=128, swap_ab=True, fuse_quant=True)
        programs, min_kb = DECODE_PROGRAMS, DECODE_MIN_KBLOCKS
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


@dataclass(frozen=True)
class GemvConfig:
    """One launch shape of `fp8_gemv._fp8_gemv_kernel`: bn weight rows per program (divides 128, so one
    weight-scale row), ku K blocks per load step, the K split (0 = `gemv_split`)."""

    bn: int = 32
    ku: int = 4
    split_k: int = 0
    num_warps: int = 4


GEMV = True  # one-token linears on the CUDA-core GEMV where it is faster (bench/flags.py turns it off for A/Bs)
# Rows up to which the GEMV runs (the kernel takes up to GEMV_MAX_ROWS). Its CUDA-core work grows with the rows
# while the tensor-core GEMM's does not: at M = 2 only wq_a / wkv were faster (5.48 / 4.28 vs 5.73 / 5.47 µs),
# sh_w13 12.65 vs 9.61, wo_a 20.9 vs 18.7 (session 17, sweep_gemv.py --rows). So one row only.
GEMV_MAX_M = 1
GEMV_MAX_ROWS = 4  # what the kernel takes (its rows loop against one weight tile)
# FP8 x FP8 weights of this many bytes and more stay on the tensor-core GEMM at M = 1: Flash wq_b and wo_b
# (33.5 MB) took 11.8 / 13.4 µs there and 13.3 / 13.9 on the GEMV; below it the GEMV won by 0.3-1.8 µs
# (sweep_gemv.py, session 17). The W8A16 wo_a (33.5 MB) has no such limit: 18.6 -> 13.1 µs. Session 24 (s24b-d):
# re-swept without the big weights' L2 prefetch, wo_b gained 0.7 µs on the GEMV and 32-row shapes 0-0.4 µs per
# linear in isolation, but in the model's 8-layer B = 1 replay wo_b on the GEMV measured the same (1.27 ms) and the
# 32-row shapes 0.02 ms slower (1.29): neither adopted.
GEMV_MAX_FP8_BYTES = 1 << 25
# A GEMV grid holding less than this (or the whole weight) in flight declines (next to pick_gemv_config's end).
GEMV_MIN_INFLIGHT = 4 << 20
# The GEMV launch's register cap (0: the compiler's choice, 124 for its 64-row tiles, e.g. the shared expert's down).
# At 104 one of its CTAs (x 128 threads = 13,312) fits beside a persistent decode GLU CTA (moe_glu_decode.GLU_BOUND:
# 136 x 384 = 52,224 of 65,536), so the shared expert's down GEMV on its side stream could run while the routed GLU
# does (session 80's time line: it started only as the GLU's CTAs exited). Offline (sass_stats fp8_gemv_wq_a_r104):
# 104 registers, no spills, the same instruction count; at 96 it spills. Opt-in, session 85: not measured.
GEMV_MAXNREG = 0


def gemv_split(tiles: int, kblocks: int, ku: int, programs: int = 1024) -> int:
    """Largest power-of-two K split keeping the grid within `programs` (~8 per SM: the GEMV holds no shared
    memory) and every split a whole number of KU steps."""
    split = 1
    while tiles * split * 2 <= programs and kblocks % (split * 2 * ku) == 0:
        split *= 2
    return split


def pick_gemv_config(m: int, n: int, k: int, groups: int = 1, quant_x: bool = True) -> GemvConfig | None:
    """The GEMV's launch shape for an [m, k] x [n, k]^T product of a few rows (n rows in `groups` equal groups), or
    None where the tensor-core GEMM should run (more rows, the large FP8 x FP8 linears, shapes it cannot tile).
    Split included, so that stacked linears can compare their launches (`dsv4.model.linear`)."""
    if (not GEMV or not 1 <= m <= min(GEMV_MAX_M, GEMV_MAX_ROWS) or k % BLOCK
            or (quant_x and n * k >= GEMV_MAX_FP8_BYTES)):
        return None
    kblocks = k // BLOCK
    # Flash, session 17 (sweep_gemv.py): 32 KB per step (64 rows x 4 K blocks; 32 x 8 where K is 8 blocks:
    # one step) below 16 MB of weight, 16 rows x 4 blocks from there (sh_w13, wo_a: more, shorter programs)
    if n * k >= 1 << 24 or m > 1:  # more rows: the fp32 weight tile stays live across them (64 values a thread)
        bn, ku = 16, 4
    else:
        bn, ku = (32, 8) if kblocks == 8 else (64, 4)
    ku = next(u for u in (ku, 2, 1) if kblocks % u == 0)
    if (n // groups) % bn or n % groups:
        return None
    split = gemv_split(n // bn, kblocks, ku)
    # Bytes in flight: every program is resident and loads one step at a time (no pipelining), so a grid that holds
    # less than GEMV_MIN_INFLIGHT (or the whole weight) waits on latency where the GEMM streams. Pro's K = 56 blocks
    # split in two only: wq_a 48 programs of 7 steps, 1.5 MiB in flight, 13.3 µs against the GEMM's 8.6 (the best of
    # 22 GEMV shapes 10.0), wkv 12.8 vs 7.9, wq_a | wkv 14.0 vs 9.0 (sweep_gemv.py, s24c). Flash's grids all hold
    # their whole weight.
    if n * split * ku * BLOCK < min(n * k, GEMV_MIN_INFLIGHT):  # (n / bn) * split programs x bn * ku * 128 bytes
        return None
    return GemvConfig(bn=bn, ku=ku, split_k=split)
