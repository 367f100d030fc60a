"""Launch shapes of the routed-MoE kernels (dsv4.kernels.moe, dsv4.kernels.moe_gemv): `MoEConfig` and
the heuristic `pick_moe_config`, from H200 and H100 sweeps (`bench/bench_gemm_moe.py`, docs/kernels_notes.md)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    bm: int
    bn1: int
    bn2: int
    quant_first: bool  # GEMM1 reads x quantised by act_quant (else quantises its gathered rows itself)
    quant_out: bool  # GEMM1 writes z as FP8 + scales (needs bn1 == 128), else bf16
    warps1: int = 4
    warps2: int = 4
    num_stages: int = 3
    use_asm: bool = True
    swap: bool = False  # FP8 wgmma with the weights as M, bm tokens as N: faster, not fp32-exact
    gemv: int = 0  # MXFP4 W4A8 on CUDA cores, one program per pair and `gemv` rows (dsv4.kernels.moe_gemv)
    gemv_unroll: int = 2  # ... with this many 128-wide K blocks loaded per loop step
    gemv_mma: bool = False  # ... the group sums as f16 tensor-core MMAs instead (moe_gemv method "mma", gemv 64/128)
    gemv_stages: int = 3  # ... "mma": pipeline depth of its weight / activation loads (loop steps)
    gemv_dot_blocks: int = 1  # ... "mma": K blocks per tl.dot (<= gemv_unroll)
    gemv_down_stages: int = 0  # ... the down (W2) kernel's num_stages where it differs from the GLU's (0: the same)
    gemv_down_dot_blocks: int = 0  # ... and its dot_blocks (0: the same)
    gemv_split: int = 1  # ... programs per GLU row tile along K (split-K reduced in the launch)
    gemv_split_down: int = 1  # ... the same for the down (W2) kernel
    gemv_pairs: int = 1  # ... "mma": pairs of one expert per program (1, 2 or 4: dsv4.kernels.moe_gemv_pairs)
    wide: bool = False  # MXFP4: W4A8 values on bf16 wgmma, one K chain (dsv4.kernels.moe_wide; bm, bn2, warps1, stages)
    maxnreg: int = 0  # ... its register cap per thread (0: the compiler's choice; 128 with 8 warps: 2 CTAs per SM)
    mixed: bool = False  # ... bm 128: 128-row tiles over pairs of 64-row blocks, 64-row tiles for odd last blocks


# H200 sweep (session 5): the per-pair path wins up to ~1.4 pairs per touched expert (Flash B <= 24,
# Pro B <= 48), ties at 1.42 (Flash B = 32), loses from ~1.7 (Flash B = 48). Session 7: its tensor-core
# variant (gemv_mma, 64 rows, 2 K blocks per step) beats the CUDA-core one, Flash, µs with L2 flushed:
# B = 1 62.0 vs 64.6, B = 8 252.8 vs 308.0 (docs/benchmarks.md #5, session 7)
GEMV_MAX_PAIRS_PER_EXPERT = 1.45
# Split-K of the per-pair GLU (session 8, Flash, µs L2-flushed): 6 pairs (192 row-tile programs for 132 SMs)
# 62.3 -> 56.4 with 2 splits (4 splits 59.0; also splitting the down kernel 59.4); 48 pairs 252.1 -> 266.8,
# so only batches this small split. Pro (48 row tiles per pair) not measured.
GEMV_SPLIT_MAX_PAIRS = 8
# (Measured and removed, sessions 44-46: the GLU's gate rows and up rows in programs of their own at <= 8 pairs,
# 5 CTAs per SM instead of 3. The MoE call alone won once (s45b 41.4 vs 43.6 µs at 6 pairs) and lost once (s46a
# 46.7 vs 43.6); the 8-layer B = 1 rows lost twice on a quiet GPU, 1.27 / 1.26 vs 1.21 / 1.21 ms.)
# MXFP4 at prefill sizes: the bf16-wgmma kernel (dsv4.kernels.moe_wide) from this many pairs per expert.
# Session 8, Flash, ms L2-flushed (bench_gemm_moe): M = 4096 (96 pairs per expert) 128-row tiles 6.31 vs
# 8.92 for the per-group kernel, M = 8192 12.20 vs 15.48; M = 1024 (24 per expert) 5.61 vs 3.32.
WIDE_MIN_PAIRS_PER_EXPERT = 64
# ... and with 64-row tiles from this many (Gluon kernel, session 10, bench/runs/run_device_s10d.sh): M = 2048
# (48 per expert) 3.79 vs 4.67 ms for the per-group kernel; M = 1024 (24 per expert) 3.66 vs 3.25. Session 27
# (bf16 widening, bench_moe_flags): M = 768 (18 per expert) 2.36 vs 3.11 (s27e), M = 1024 2.40 vs 3.27, M = 1536
# (36 per expert) 2.40 vs 4.57 (s27d). Session 28 (s28i, Flash): M = 384 (9 per expert) 2.32 vs 3.03, M = 512 2.38
# vs 3.09, M = 640 2.43 vs 3.15; below 9 per expert not measured (M = 256, 6 per expert, takes the per-group kernel's
# bm 16 branch, 2.06 ms); Pro not measured at these sizes
WIDE64_MIN_PAIRS_PER_EXPERT = 9  # (below WIDE32_MAX_PAIRS_PER_EXPERT: the 32-token tiles first)
# ... and its 128-row tiles mixed with 64-row ones from this many (`moe_wide(mixed=True)`: an expert's last tile is
# a 64-row one when its pairs fill one more 64-row block; Gluon kernels only). Session 26 (s26c, bench_moe_flags,
# Flash MoE call, ms L2-flushed, 128-row tiles -> mixed): M = 4096 (96 pairs per expert) 4.29 -> 4.43, 8192 (192)
# 8.28 -> 7.99, 16384 (384) 14.44 -> 14.19; bit-identical outputs
MIXED_MIN_PAIRS_PER_EXPERT = 128
# Up to this many pairs, the CUDA-core per-pair method with split-K (moe_gemv_cuda) instead of the tensor-core
# one, launch shape GEMV_CUDA_SHAPE = (rows per program, K blocks per step, GLU split, down split). Off: its best
# shape took 47.3 µs per Flash MoE call at B = 1 against 42.2 for the default (bench/sweep_moe_gemv.py, s17g).
GEMV_CUDA_MAX_PAIRS = 0
# Blocks of pairs of one expert per program (tensor-core per-pair kernel, dsv4.kernels.moe_gemv_pairs) from
# GEMV_PAIRED_FROM to GEMV_PAIRED_MAX pairs per touched expert (uniform ids): two pairs (2 K blocks per loop step),
# four (1 K block per step: 16 MMA columns) from GEMV_PAIRS4_FROM; the per-group kernel beyond.
# Session 18, bench/sweep_moe_batch.py, Flash, µs per call in a graph (s18c / s18f): one pair per program / two /
# four at 1 K block per step / the per-group kernel: B = 16 (1.20 pairs per touched expert) 447 / 398 / - / -,
# B = 32 (1.42) 848 / 684 / - / -, B = 64 (1.93) 1,670 / 1,168 / 1,163 / 1,536, B = 96 (2.51) 2,472 / 1,626 /
# 1,384 / 1,761, B = 128 (3.16) 3,284 / 2,024 / 1,590 / 1,910, B = 192 (4.55) 4,907 / 2,895 / 1,974 / 1,996,
# B = 256 (6.0) 6,520 / 3,734 / 2,452 / 2,036; B = 8 (1.10) 238 / 233 (s18b). Pro (s18f): B = 16 1,143 / 1,076,
# B = 64 (1.58) 4,541 / 3,421 / 3,780. Session 78 (s78b / s78c, H100, Flash MoE call in graphs of 16 routings, µs,
# two alternating rounds): one pair per program is now the persistent Gluon GLU / down (moe_glu_decode, session 47),
# and against blocks of pairs it wins up to M = 11 (1.13 pairs per touched expert): M = 8 254.1 -> 243.2, 9 276.2 ->
# 269.7, 10 310.1 -> 299.0, 11 325.1 -> 318.0; a tie at M = 12 (355.4 / 353.3 once, 353.3 / 358.8 once) and losses
# from 16 (439 -> 470, 32 745 -> 918, 64 1,184 -> 1,830). Pro (7168) not measured: it keeps session 18's bound.
GEMV_PAIRED_FROM = 1.14
GEMV_PAIRED_FROM_BY_HIDDEN = {7168: 1.08}
GEMV_PAIRED_MAX = 4.0
# ... except for experts of these hidden sizes: the upper bound measured where it differs. Pro (7168) against the
# wide kernel's 16-token tiles, session 66 (s66e, H100, two rounds within 0.2 %, µs per call in a graph, blocks of
# pairs / tiles): M = 128 (2.3 pairs per touched expert) 6,236 / 6,198, M = 160 6,733 / 6,616, M = 192 7,052 /
# 6,805, M = 224 (3.6) 7,346 / 6,979; Flash (4096) keeps 4.0: M = 160 (3.8) 1,784 / 1,806
GEMV_PAIRED_MAX_BY_HIDDEN = {7168: 2.3}
GEMV_PAIRS4_FROM = 2.3
# (Blocks of two / four pairs take 2 / 1 K blocks per loop step. The most that fit moe_gemv.MAX_COLUMNS = 32, 4 / 2,
# lose: session 78, s78h, H100, µs per call in a graph, M = 64 two pairs 1,189-1,211 -> 2,630; M = 96 / 128 four
# pairs 1,559 / 1,688 -> 1,689 / 1,980.)
# Two pairs per program (the paired Triton GEMV): its GLU and down take 2 K blocks per tl.dot (3 pipeline stages) up
# to GEMV_PAIRED_DOT2_MAX pairs per touched expert, 1 K block per dot with 2 stages above (the default was 1 / 3).
# Session 79 (H100, bench/sweep_moe_batch.py --configs, µs per call in a graph of 16 routings, rounds alternated,
# outputs bit-identical): Flash M = 12 (1.13) 348 -> 338 / 338, M = 16 432 -> 417 / 419, M = 32 (1.42) 729 -> 705 /
# 711; M = 48 (1.67) 976 -> 952 / 956 with 2 stages (dot2 953 / 964 / 964), M = 56 1,105 -> 1,063 / 1,071, M = 64
# (1.93) 1,183-1,223 -> 1,152-1,195 (dot2 1,187-1,202); both at once lose (M = 64 1,337). Pro: dot2 wins at every
# M, 16 1,229 -> 1,158 / 1,161, 32 2,189 -> 2,068 / 2,088, 48 2,955 -> 2,831 / 2,787, 64 3,644-3,754 -> 3,465 / 3,455
# (2 stages 3,563-3,676). Four pairs (1 K block per step) are the same at 2-5 stages or worse (M = 64-128).
GEMV_PAIRED_DOT2_MAX = 1.55
GEMV_PAIRED_DOT2_MAX_BY_HIDDEN = {7168: GEMV_PAIRED_MAX_BY_HIDDEN[7168]}
GEMV_PAIRED_DOT1_STAGES = 2
# One pair per program: the Triton down's K blocks per tl.dot for experts of these hidden sizes (else the GLU's 1;
# Flash's one-pair down is the persistent Gluon kernel where it fits). Pro, session 80 (s80a, H100, sweep_moe_batch.py
# --configs, two rounds, bit-identical): M = 1 97.4 / 97.5 -> 96.3 / 96.2 µs, M = 2 172.9 / 173.0 -> 170.8 / 170.5,
# M = 4 319.8 / 318.7 -> 318.6 / 318.9.
GEMV_ONE_DOWN_DOT_BLOCKS_BY_HIDDEN = {7168: 2}
GEMV_CUDA_SHAPE = (64, 2, 8, 2)
# The per-group kernel's 16-row tiles up to this many pairs per expert (above the per-pair paths' range; MXFP4
# experts take the wide kernel's 16-token tiles first, up to WIDE16_MAX_PAIRS_PER_EXPERT)
PER_GROUP_MAX_PAIRS_PER_EXPERT = 8
# Token tile of the wide kernel from WIDE64_MIN_PAIRS_PER_EXPERT to WIDE_MIN_PAIRS_PER_EXPERT (its wgmma N; a sweep
# knob, bench/runs/run_device_s65c.sh; the 16- and 32-token tiles below have ranges of their own)
WIDE_SMALL_BM = 64
# The wide kernel with 16-token tiles above the per-pair paths' range up to WIDE16_MAX_PAIRS_PER_EXPERT pairs per
# expert, 32-token tiles up to WIDE32_MAX_PAIRS_PER_EXPERT. Session 66 (s66b, H100, µs per call of 8 routings in a
# graph, the earlier rule -> 16-token tiles): Flash M = 192 (4.5 per expert, the per-group kernel) 2,059 -> 1,836,
# M = 256 2,123 -> 1,886, M = 384 (9, 64-token tiles) 2,190 -> 1,960, M = 512 2,247 -> 2,073; Pro M = 256 (4 per
# expert) 9,007 -> 7,101, M = 512 9,446 -> 7,399. 32-token tiles against 64: Flash M = 640 2,128 / 2,300, M = 768
# 1,930 / 2,105, M = 1024 (24 per expert) 2,054 / 2,254, M = 1536 2,850 / 2,299; Pro M = 1024 7,459 / 8,100. M = 128
# (Flash, 3 per expert: the per-pair kernel, 4 pairs per program) 1,688 against 1,738 for 16-token tiles.
WIDE16_MAX_PAIRS_PER_EXPERT = 12
WIDE32_MAX_PAIRS_PER_EXPERT = 24


def pick_moe_config(num_pairs: int, num_experts: int, act: str = "fp8", hidden: int = 0) -> MoEConfig:
    """Heuristic launch shape from the average number of (token, slot) pairs per used expert
    (the winners of the H200 sweep in docs/kernels_notes.md); hidden: the experts' model width where a bound
    depends on it (GEMV_PAIRED_MAX_BY_HIDDEN; 0: unknown, the Flash-measured bounds).

    A 64x128 GLU tile needs 8 warps to keep both accumulators (gate, up) in registers. Past the per-pair paths,
    MXFP4 experts take dsv4.kernels.moe_wide (16-token tiles, then 32, 64 from WIDE64_MIN_PAIRS_PER_EXPERT, 128
    from WIDE_MIN_PAIRS_PER_EXPERT; `fused_moe` runs others with `per_group_config`).
    """
    per_expert = num_pairs / max(1, min(num_pairs, num_experts))
    # pairs per *touched* expert if the ids were uniform: E (1 - exp(-pairs/E)) experts are touched
    per_touched = num_pairs / max(1.0, num_experts * -math.expm1(-num_pairs / max(1, num_experts)))
    if num_pairs <= GEMV_CUDA_MAX_PAIRS and act == "fp8":
        bn, unroll, split, split_down = GEMV_CUDA_SHAPE
        return MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=bn, gemv_unroll=unroll,
                         gemv_split=split, gemv_split_down=split_down)
    paired = (GEMV_PAIRED_FROM_BY_HIDDEN.get(hidden, GEMV_PAIRED_FROM) <= per_touched
              <= GEMV_PAIRED_MAX_BY_HIDDEN.get(hidden, GEMV_PAIRED_MAX))
    four = paired and per_touched >= GEMV_PAIRS4_FROM
    two = paired and not four
    dot2 = two and per_touched <= GEMV_PAIRED_DOT2_MAX_BY_HIDDEN.get(hidden, GEMV_PAIRED_DOT2_MAX)
    if (per_touched <= GEMV_MAX_PAIRS_PER_EXPERT or paired) and act == "fp8":  # MXFP4 only (FP8: the MMA fields)
        return MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=4, warps2=4,
                         num_stages=4, gemv=64, gemv_mma=True, gemv_unroll=1 if four else 2,
                         gemv_dot_blocks=2 if dot2 else 1,
                         gemv_stages=GEMV_PAIRED_DOT1_STAGES if two and not dot2 else 3,
                         gemv_split=2 if num_pairs <= GEMV_SPLIT_MAX_PAIRS and not paired else 1,
                         gemv_down_dot_blocks=0 if paired else GEMV_ONE_DOWN_DOT_BLOCKS_BY_HIDDEN.get(hidden, 0),
                         gemv_pairs=(4 if four else 2) if paired else 1)
    if per_expert <= max(WIDE16_MAX_PAIRS_PER_EXPERT, WIDE32_MAX_PAIRS_PER_EXPERT) and act == "fp8":
        return wide_config(16 if per_expert <= WIDE16_MAX_PAIRS_PER_EXPERT else 32)
    if per_expert <= PER_GROUP_MAX_PAIRS_PER_EXPERT:
        return per_group_config(num_pairs, num_experts, act)
    if per_expert >= WIDE64_MIN_PAIRS_PER_EXPERT and act == "fp8":
        cfg = wide_config(128 if per_expert >= WIDE_MIN_PAIRS_PER_EXPERT else WIDE_SMALL_BM)
        return dataclasses.replace(cfg, mixed=cfg.bm == 128 and per_expert >= MIXED_MIN_PAIRS_PER_EXPERT)
    if per_expert <= 32:
        return MoEConfig(bm=32, bn1=64, bn2=128, quant_first=True, quant_out=False, warps1=4, warps2=4,
                         num_stages=4)
    return large_batch_config(act)


def per_group_config(num_pairs: int, num_experts: int, act: str = "fp8") -> MoEConfig:
    """The per-group kernel's shape: 16-row tiles up to PER_GROUP_MAX_PAIRS_PER_EXPERT, else `large_batch_config`;
    also what `fused_moe` runs a `wide` config as where the wide kernel does not apply (FP8 experts, MXFP4 scales past
    `wide_ok`)."""
    if num_pairs / max(1, min(num_pairs, num_experts)) > PER_GROUP_MAX_PAIRS_PER_EXPERT:
        return large_batch_config(act)
    return MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=act == "fp8", warps1=4, warps2=4,
                     num_stages=4)


def wide_config(bm: int) -> MoEConfig:
    """The MXFP4 wide kernel (dsv4.kernels.moe_wide) with bm-token tiles, as `pick_moe_config` runs it."""
    return MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, num_stages=3, wide=True)


def large_batch_config(act: str = "fp8") -> MoEConfig:
    """The per-group kernel's shape for many pairs per expert."""
    return MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=act == "fp8", warps1=8, warps2=4,
                     num_stages=3)
