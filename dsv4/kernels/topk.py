"""Per-row top-k of indexer scores as an ascending index list, one launch, beside a torch reference.

`topk_lowest_index(scores [B, N], k, present [B, N] | None, mark_absent=False) -> (picked [B, k] int64, valid [B, k]
bool)`; mark_absent: picks that are not present hold -1 in `picked` (the decode attention kernel's index list).
`visible` (int32 [B], instead of `present`): entry n is present in row b iff n < visible[b] (a prompt chunk's causal
entry counts), and `index_dtype=torch.int32` writes the list as the prefill attention kernel reads it.

The picked SET of row b is the first k entries of the order (score descending, index ascending) --
exactly what `torch.sort(scores, descending=True, stable=True).indices[:, :k]` chooses (the
indexer's `top_k_lowest_index`). The list is returned in ascending index order, and
`valid = present[b, picked]` (all True without `present`). This is `Indexer._pick` in one launch.

Ordering details (those of torch's CPU sort, which the reference runs):
  * -inf (absent entries) ranks below every finite score; equal scores go by lowest index.
  * -0.0 and +0.0 are equal scores (ties by index), since torch's comparisons treat them equal.
  * NaN, of either sign bit, ranks above +inf and all NaNs are equal (ties by index). Torch's own
    casts make NaNs of both signs (fp32 NaN -> bf16 gives 0xFFFF), so raw bit order would not do.
    (Indexer scores are never NaN in practice; this only keeps kernel and reference identical.)

Kernel: grid (B,), one program per row, the row streamed in chunks of BLOCK so N of 262K works.
Each score becomes an order-preserving unsigned key (sign set: all bits flipped, else the sign bit
set; -0 -> +0 and every NaN -> the largest key first), 16 significant bits for bf16/fp16, 32 for
fp32. A radix select finds the k-th largest key T one 8-bit digit at a time (2 passes over the row
for 16-bit keys, 4 for fp32), each pass a `tl.histogram` of the digit among the keys that match
the digits fixed so far. Then `take` = the number of keys equal to T still needed, and a last pass
selects key > T plus the first `take` keys == T in index order (one `tl.cumsum` counts both before
each key), and scatters each selected index to its exclusive prefix count of selected -- so the output
comes out ascending and every one of its k slots is written exactly once (no pre-fill needed).
Zero and NaN are recognised on the bits, not by float compares: Triton's interpreter compares bf16
as raw bits (NaN == NaN, -0 != +0), which would hide bugs of the compiled kernel. Device ops only:
CUDA-graph capturable.

A few long rows (a decode step's indexer at long contexts: one row per sequence, N = context / 4) would leave
all but B SMs idle while each program streams its row three times, so such rows split into slices
(`split_slices`): the same two digit passes and the select, each a launch of (row, slice) programs that sum
the slices' histograms (identical picks).
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton  # noqa: F401
from dsv4.kernels._triton import arrival_counters, pdl_kernel, pdl_wait

SCORE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INF_BITS = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00, torch.float32: 0x7F800000}  # +inf; above: NaN


def _check(scores: torch.Tensor, k: int, present: torch.Tensor | None, who: str) -> None:
    if scores.dim() != 2 or scores.dtype not in SCORE_DTYPES:
        raise ValueError(f"{who}: scores must be bf16/fp16/fp32 [B, N], got {scores.dtype} {tuple(scores.shape)}")
    n = scores.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"{who}: k must be an int with 1 <= k <= N={n}, got {k!r}")
    if present is not None and (present.dtype != torch.bool or present.shape != scores.shape
                                or present.device != scores.device):
        raise ValueError(f"{who}: present must be bool {tuple(scores.shape)} on {scores.device}, got "
                         f"{present.dtype} {tuple(present.shape)} on {present.device}")


# --------------------------------------------------------------------------- torch reference

def topk_lowest_index_ref(scores: torch.Tensor, k: int,
                          present: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sort-based definition: stable descending sort, first k indices, re-sorted ascending."""
    _check(scores, k, present, "topk_lowest_index_ref")
    picked = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k].sort(dim=1).values
    if present is None:
        return picked, torch.ones_like(picked, dtype=torch.bool)
    return picked, present.gather(1, picked)


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:

    @triton.jit
    def _order_keys(S, row, offs, inb, KEY16: tl.constexpr, INF_BITS: tl.constexpr):
        """Scores -> uint32 keys whose unsigned order is the score order (16-bit keys in the top half,
        low half zero, so the 2 digit passes fix them completely). INF_BITS: +inf's bits; above: NaN."""
        x = tl.load(S + row + offs, mask=inb, other=0.0)
        if KEY16:
            bits = x.to(tl.uint16, bitcast=True).to(tl.uint32)
            key = tl.where((bits >> 15) != 0, bits ^ 0xFFFF, bits | 0x8000)
            mag = bits & 0x7FFF
            key = tl.where(mag > INF_BITS, 0xFFFF, tl.where(mag == 0, 0x8000, key))  # NaN on top; -0 == +0
            key = key << 16
        else:
            bits = x.to(tl.uint32, bitcast=True)
            key = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
            mag = bits & 0x7FFFFFFF
            key = tl.where(mag > INF_BITS, 0xFFFFFFFF, tl.where(mag == 0, 0x80000000, key))
        return key

    @triton.jit
    def _chunk_keys(S, row, start, lane, N, ss_n, KEY16: tl.constexpr, INF_BITS: tl.constexpr, LIST=None,
                    GATHER: tl.constexpr = False):
        """(indices, in bounds, keys) of the chunk at `start`. Read again by every pass: loading a one-chunk row's
        keys once for all passes gave the same picks and no speed (session 20, 5.21 -> 5.29 µs), so it went.
        GATHER: the chunk of the entry list LIST (N entries listed, in index order) instead of the row."""
        pos = start + lane
        inb = pos < N
        idx = tl.load(LIST + pos, mask=inb, other=0) if GATHER else pos
        return idx, inb, _order_keys(S, row, idx * ss_n, inb, KEY16, INF_BITS)

    @pdl_kernel
    @triton.jit
    def _topk_kernel(S, PRESENT, PICKED, VALID, N, K, ss_b, ss_n, sp_b, sp_n, so_b, sv_b,
                     KEY16: tl.constexpr, INF_BITS: tl.constexpr, HAS_PRESENT: tl.constexpr, BLOCK: tl.constexpr,
                     MARK_ABSENT: tl.constexpr = False, HAS_VISIBLE: tl.constexpr = False):
        pdl_wait()
        topk_row(tl.program_id(0).to(tl.int64), S, PRESENT, PICKED, VALID, N, K, ss_b, ss_n, sp_b, sp_n, so_b, sv_b,
                 KEY16, INF_BITS, HAS_PRESENT, BLOCK, MARK_ABSENT, HAS_VISIBLE)

    @triton.jit
    def topk_row(b, S, PRESENT, PICKED, VALID, N, K, ss_b, ss_n, sp_b, sp_n, so_b, sv_b, KEY16: tl.constexpr,
                 INF_BITS: tl.constexpr, HAS_PRESENT: tl.constexpr, BLOCK: tl.constexpr, MARK_ABSENT: tl.constexpr,
                 HAS_VISIBLE: tl.constexpr = False, LIST=None, GATHER: tl.constexpr = False):
        """Row b's picks (int64 b: the kernel's program, or the last-arriving program of the decode indexer's
        scores launch, `indexer_scores.indexer_pick`). MARK_ABSENT: a pick that is not present stored as -1.
        HAS_VISIBLE: PRESENT holds the row's int32 visible count instead of a mask. GATHER: among the N entries
        listed at LIST (in index order) only."""
        row = b * ss_b
        lane = tl.arange(0, BLOCK)
        take, prefix = _radix_digits(S, row, N, lane, ss_n, K, KEY16, INF_BITS, BLOCK, LIST, GATHER)
        zero = tl.full([], 0, tl.int32)
        _select_span(b, S, row, 0, N, lane, ss_n, prefix, take, zero, zero, PRESENT, PICKED, VALID, sp_b, sp_n, so_b,
                     sv_b, KEY16, INF_BITS, HAS_PRESENT, BLOCK, MARK_ABSENT, HAS_VISIBLE, LIST, GATHER)

    @triton.jit
    def _radix_digits(S, row, n, lane, ss_n, take, KEY16: tl.constexpr, INF_BITS: tl.constexpr, BLOCK: tl.constexpr,
                      LIST=None, GATHER: tl.constexpr = False):
        """Radix select of the take-th largest key T among entries [0, n), most significant digit first -> (the
        keys == T still to be picked, T). `prefix` holds the digits of T fixed so far, `take` how many of the keys
        matching them are still to be picked (1 <= take <= matches)."""
        bins = tl.arange(0, 256)
        prefix = tl.full([], 0, tl.uint32)
        for p in tl.static_range(2 if KEY16 else 4):
            hist = _digit_hist(S, row, 0, n, lane, ss_n, prefix, p, KEY16, INF_BITS, BLOCK, LIST, GATHER)
            take, prefix = _fix_digit(hist, bins, take, prefix, p)
        return take, prefix

    @pdl_kernel
    @triton.jit
    def _topk_sampled_kernel(S, PRESENT, PICKED, VALID, LIST, N, K, cap, ss_b, ss_n, sp_b, sp_n, so_b, sv_b,
                             KEY16: tl.constexpr, INF_BITS: tl.constexpr, HAS_PRESENT: tl.constexpr,
                             BLOCK: tl.constexpr, STRIDE: tl.constexpr, MARK_ABSENT: tl.constexpr = False,
                             HAS_VISIBLE: tl.constexpr = False, SBLOCK: tl.constexpr = 0, LBLOCK: tl.constexpr = 0,
                             GROUP: tl.constexpr = 1):
        """`_topk_kernel` with fewer keys histogrammed (`SAMPLED`): tau = the key with about 2k / STRIDE keys above
        it among every STRIDE-th entry; one pass lists the row's keys >= tau in index order (LIST [B, cap]); if
        there are k to cap of them, T lies among them and the radix select and the select run on that list,
        else on the row as `topk_row` does. The same picks either way. SBLOCK / LBLOCK: the chunk of the sample's
        and of the list's passes (0: BLOCK); GROUP: the listing's positions summed per GROUP entries first (a scan
        of BLOCK / GROUP sums: Triton scans a [BLOCK] tensor with one entry per thread and rep, a warp scan each)."""
        pdl_wait()
        b = tl.program_id(0).to(tl.int64)
        row = b * ss_b
        lane = tl.arange(0, BLOCK)
        SB: tl.constexpr = SBLOCK if SBLOCK > 0 else BLOCK
        LB: tl.constexpr = LBLOCK if LBLOCK > 0 else BLOCK
        ns = tl.cdiv(N, STRIDE)
        _, tau = _radix_digits(S, row, ns, tl.arange(0, SB), ss_n * STRIDE, tl.minimum(ns, tl.cdiv(2 * K, STRIDE)),
                               KEY16, INF_BITS, SB)
        listed = LIST + b * cap
        m = tl.full([], 0, tl.int32)
        for start in range(0, N, BLOCK):
            idx, inb, key = _chunk_keys(S, row, start, lane, N, ss_n, KEY16, INF_BITS)
            keep = (inb & (key >= tau)).to(tl.int32)
            if GROUP > 1:
                kg = tl.reshape(keep, [BLOCK // GROUP, GROUP])
                sums = tl.sum(kg, axis=1)
                at = tl.reshape(m + (tl.cumsum(sums, axis=0) - sums)[:, None] + tl.cumsum(kg, axis=1) - kg, [BLOCK])
            else:
                at = m + tl.cumsum(keep, axis=0) - keep
            tl.store(listed + at, idx, mask=(keep != 0) & (at < cap))
            m += tl.sum(keep, axis=0)
        tl.debug_barrier()  # (every thread's list stores before any thread loads the list)
        if (m >= K) & (m <= cap):
            topk_row(b, S, PRESENT, PICKED, VALID, m, K, ss_b, ss_n, sp_b, sp_n, so_b, sv_b, KEY16, INF_BITS,
                     HAS_PRESENT, LB, MARK_ABSENT, HAS_VISIBLE, listed, True)
        else:
            topk_row(b, S, PRESENT, PICKED, VALID, N, K, ss_b, ss_n, sp_b, sp_n, so_b, sv_b, KEY16, INF_BITS,
                     HAS_PRESENT, BLOCK, MARK_ABSENT, HAS_VISIBLE)

    @triton.jit
    def _digit_hist(S, row, lo, hi, lane, ss_n, prefix, p: tl.constexpr, KEY16: tl.constexpr,
                    INF_BITS: tl.constexpr, BLOCK: tl.constexpr, LIST=None, GATHER: tl.constexpr = False):
        """Histogram [256] of digit p (8 bits, most significant first) of the keys of entries [lo, hi) whose
        digits before p are prefix's."""
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(lo, hi, BLOCK):
            idx, inb, key = _chunk_keys(S, row, start, lane, hi, ss_n, KEY16, INF_BITS, LIST, GATHER)
            if p > 0:
                inb = inb & ((key >> (32 - 8 * p)) == (prefix >> (32 - 8 * p)))
            hist += tl.histogram(((key >> (24 - 8 * p)) & 0xFF).to(tl.int32), 256, mask=inb)
        return hist

    @triton.jit
    def _fix_digit(hist, bins, take, prefix, p: tl.constexpr):
        """Digit p of T from the histogram of the keys matching prefix: the largest digit with at least `take`
        matches at or above it -> (take less the matches above that digit, prefix with the digit set)."""
        at_least = _suffix_sums(hist)
        t = tl.max(tl.where(at_least >= take, bins, -1), axis=0)
        take -= tl.sum(tl.where(bins > t, hist, 0), axis=0)
        return take, prefix | (t.to(tl.uint32) << (24 - 8 * p))

    @triton.jit
    def _suffix_sums(hist):
        """[256]: the matches with digit >= bin."""
        return tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist

    @triton.jit
    def _select_span(b, S, row, lo, hi, lane, ss_n, prefix, take, n_above, ties, PRESENT, PICKED, VALID,
                     sp_b, sp_n, so_b, sv_b, KEY16: tl.constexpr, INF_BITS: tl.constexpr, HAS_PRESENT: tl.constexpr,
                     BLOCK: tl.constexpr, MARK_ABSENT: tl.constexpr, HAS_VISIBLE: tl.constexpr, LIST=None,
                     GATHER: tl.constexpr = False):
        """Select key > T, and the first `take` keys == T by index, among entries [lo, hi), given n_above keys > T
        and `ties` keys == T before lo; compact in index order: a selected key's slot is the keys > T before it
        plus min(ties before it, take), both from one scan (ties counted in the high half; a chunk holds fewer
        than 2^16 keys)."""
        for start in range(lo, hi, BLOCK):
            idx, inb, key = _chunk_keys(S, row, start, lane, hi, ss_n, KEY16, INF_BITS, LIST, GATHER)
            above = (inb & (key > prefix)).to(tl.int32)
            tie = (inb & (key == prefix)).to(tl.int32)
            both = above + (tie << 16)
            before = tl.cumsum(both, axis=0) - both  # exclusive, per chunk
            ties_before = ties + (before >> 16)
            sel = (above != 0) | ((tie != 0) & (ties_before < take))
            pos = n_above + (before & 0xFFFF) + tl.minimum(ties_before, take)
            if HAS_VISIBLE:
                ok = (idx < tl.load(PRESENT + b)).to(tl.uint8)
            elif HAS_PRESENT:
                ok = tl.load(PRESENT + b * sp_b + idx * sp_n, mask=sel, other=0)
            else:
                ok = tl.full([BLOCK], 1, tl.uint8)
            if MARK_ABSENT:
                idx = tl.where(ok != 0, idx, -1)
            tl.store(PICKED + b * so_b + pos, idx.to(PICKED.dtype.element_ty), mask=sel)
            tl.store(VALID + b * sv_b + pos, ok, mask=sel)
            n_above += tl.sum(above, axis=0)
            ties += tl.sum(tie, axis=0)


    # A row split into slices (`SPLIT_*` below): one program per (row, slice) in each of three launches, so a long
    # row of a few-row decode batch is not one program streaming it three times while the other SMs idle. The row's
    # digit histograms are summed by atomics into TOT [B, 2, 256] (zeroed by the select's last program of the row,
    # so left zeroed for the next call: `arrival_counters`); the select's offsets come from what each slice left in
    # ROWS [B, 2, slices, 256] and ABOVE [B, slices]. Pass 0: the high digit's histogram. Pass 1: the high digit of
    # T from TOT, the slice's keys above it (ABOVE), then the low digit's histogram among the keys matching it,
    # kept as suffix sums (matches with low digit >= bin). Select: T, and the keys > T and ties in the slices
    # before its own from two columns of those suffix sums (16-bit keys only: two digits).

    @triton.jit
    def _slice_program(SLICE):
        """(row b, slice i, slices per row, the slice's first entry) of this (row, slice) program."""
        i = tl.program_id(1)
        return tl.program_id(0).to(tl.int64), i, tl.num_programs(1), i.to(tl.int64) * SLICE

    @pdl_kernel
    @triton.jit
    def _split_hist_kernel(S, TOT, ROWS, ABOVE, N, K, SLICE, ss_b, ss_n, PASS: tl.constexpr, INF_BITS: tl.constexpr,
                           BLOCK: tl.constexpr):
        pdl_wait()
        b, i, nsl, lo = _slice_program(SLICE)
        bins = tl.arange(0, 256)
        prefix = tl.full([], 0, tl.uint32)
        if PASS == 1:
            _, prefix = _fix_digit(tl.load(TOT + b * 512 + bins), bins, K, prefix, 0)
            own = tl.load(ROWS + (b * 2 * nsl + i) * 256 + bins)  # this slice's pass-0 histogram
            tl.store(ABOVE + b * nsl + i, tl.sum(tl.where(bins > (prefix >> 24).to(tl.int32), own, 0), axis=0))
        hist = _digit_hist(S, b * ss_b, lo, tl.minimum(lo + SLICE, N), tl.arange(0, BLOCK), ss_n, prefix, PASS, True,
                           INF_BITS, BLOCK)
        tl.atomic_add(TOT + b * 512 + PASS * 256 + bins, hist, mask=hist != 0, sem="relaxed")
        if PASS == 1:
            hist = _suffix_sums(hist)
        tl.store(ROWS + ((b * 2 + PASS) * nsl + i) * 256 + bins, hist)

    @pdl_kernel
    @triton.jit
    def _split_select_kernel(S, TOT, CNT, ROWS, ABOVE, PRESENT, PICKED, VALID, N, K, SLICE, ss_b, ss_n, sp_b, sp_n,
                             so_b, sv_b, INF_BITS: tl.constexpr, HAS_PRESENT: tl.constexpr, BLOCK: tl.constexpr,
                             SP: tl.constexpr, MARK_ABSENT: tl.constexpr, HAS_VISIBLE: tl.constexpr):
        pdl_wait()
        b, i, nsl, lo = _slice_program(SLICE)
        bins = tl.arange(0, 256)
        take, prefix = _fix_digit(tl.load(TOT + b * 512 + bins), bins, K, tl.full([], 0, tl.uint32), 0)
        take, prefix = _fix_digit(tl.load(TOT + b * 512 + 256 + bins), bins, take, prefix, 1)
        low = ((prefix >> 16) & 0xFF).to(tl.int32)
        j = tl.arange(0, SP)
        before = j < i
        suffix = ROWS + ((b * 2 + 1) * nsl + j) * 256  # the slices' low-digit suffix sums
        at_least = tl.load(suffix + low, mask=before, other=0)
        above = tl.load(suffix + low + 1, mask=before & (low < 255), other=0)
        n_above = tl.sum(tl.load(ABOVE + b * nsl + j, mask=before, other=0) + above, axis=0)
        _select_span(b, S, b * ss_b, lo, tl.minimum(lo + SLICE, N), tl.arange(0, BLOCK), ss_n, prefix, take, n_above,
                     tl.sum(at_least - above, axis=0), PRESENT, PICKED, VALID, sp_b, sp_n, so_b, sv_b, True, INF_BITS,
                     HAS_PRESENT, BLOCK, MARK_ABSENT, HAS_VISIBLE)
        # every program of the row has read TOT once it arrives: the last one zeroes it (the CTA barrier orders the
        # reads before the gpu-scope acq_rel atomic, as `split_k_sum`)
        tl.debug_barrier()
        if tl.atomic_add(CNT + b, 1, sem="acq_rel", scope="gpu") == nsl - 1:
            tl.store(TOT + b * 512 + bins, tl.zeros([256], dtype=tl.int32))
            tl.store(TOT + b * 512 + 256 + bins, tl.zeros([256], dtype=tl.int32))
            tl.store(CNT + b, 0)


# --------------------------------------------------------------------------- launcher

# The row's chunk: up to BLOCK_MAX entries a pass step, WARPS_LARGE warps from 2048 (a prompt chunk's rows after a
# long prefix stream 16K+ entries three times; `bench/sweep_index_scores.py --topk` times other settings).
BLOCK_MAX = 4096
WARPS_LARGE = 8


# Rows of at least SAMPLED_MIN_N entries on the one-program path histogram only a listed ~2k of their keys
# (`_topk_sampled_kernel`: a threshold from every SAMPLED_STRIDE-th entry, the keys above it listed, up to
# SAMPLED_CAP_PER_K * k of them, else the plain passes). Why: the prefill top-k is bound by its ballot histograms' ALU
# work per key (Nsight, s70a), and this makes one plain pass over the row instead of two histogram passes and the
# select. Session 71 (H100, `bench/sweep_index_scores.py --sampled`, 8K rows, k = 512, µs default -> sampled, the
# same picks): N = 16384 1,652 -> 1,919 (0.86x), 32768 3,186 -> 2,412 and 3,331 -> 2,535 (1.32x), 65536 6,591 -> 3,672
# (1.79x); the sampled passes and the listing cost about a full row pass each, which 16K entries do not repay
# (session 72 made both cheaper, below). Session 73 (H100, the same sweep with session 72's kernel): N = 4096 444 ->
# 465 (0.95x), 8192 857 -> 575 (1.49x), 16384 1,640 -> 743 (2.21x).
SAMPLED = True
SAMPLED_MIN_N = 1 << 13
SAMPLED_STRIDE = 16
SAMPLED_CAP_PER_K = 4
# Session 72: the listing's positions summed per SAMPLED_GROUP entries before the scan (Triton scanned the [BLOCK]
# keep mask one entry per thread and rep, a warp scan each: 1,105 -> 580 SASS instructions per 4,096-entry chunk),
# and with SAMPLED_FIT the sample's and the list's passes in chunks sized to them (a 1,024-entry sample or a
# 2,048-entry list no longer pays for a 4,096-entry chunk with most lanes masked; 128 instead of 188 registers).
# H100, the same sweep, µs, default -> session 71's sampled -> grouped -> grouped and fitted, picks identical:
# N = 32768 3,281 -> 2,504 -> 2,208 -> 1,200 (2.73x the default); 65536 6,706 -> 3,729 -> 3,081 -> 2,137 (3.14x).
SAMPLED_GROUP = 8
SAMPLED_FIT = True

# Split rows (`_split_hist_kernel`): rows of at least SPLIT_MIN_N entries (times rows // SPLIT_ROWS_PER_MIN) in
# batches of at most SPLIT_MAX_ROWS rows go to (row, slice) programs of SPLIT_SLICE entries (more per slice past
# SPLIT_MAX_SLICES slices). Session 70 (H100, `bench/bench_topk_split.py`, k = 512, µs one program -> split):
# 1 row: N = 4096 11.0 -> 9.1, 16384 37.4 -> 9.5, 65536 141 -> 10.1, 262144 569 -> 14.7; 8 rows: 4096 1.16x,
# 65536 6.7x; 32 rows: 4096 1.00x, 8192 1.36x; 64 rows: 8192 0.97x, 16384 1.39x, 65536 1.67x; 2048 entries lose
# at every row count (0.66-0.80x: three launches against one).
SPLIT_MIN_N = 4096
SPLIT_ROWS_PER_MIN = 16
SPLIT_MAX_ROWS = 64
SPLIT_SLICE = 1024
SPLIT_MAX_SLICES = 64


def block_for(n: int) -> int:
    """Chunk length: the row in one chunk up to BLOCK_MAX; never below 256 (one histogram bin per thread)."""
    if not 256 <= BLOCK_MAX < 1 << 16:  # (the select pass counts a chunk's ties in the high half of an int32)
        raise ValueError(f"topk.BLOCK_MAX must be in [256, 65536), got {BLOCK_MAX}")
    return max(256, min(BLOCK_MAX, triton.next_power_of_2(n)))


def topk_lowest_index(scores: torch.Tensor, k: int, present: torch.Tensor | None = None,
                      mark_absent: bool = False, visible: torch.Tensor | None = None,
                      index_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `topk_lowest_index_ref`: (picked [B, k] ascending, valid bool [B, k]); mark_absent: the
    picks that are not present hold -1 in `picked` (the decode attention's index list, no `where` launch after).
    visible (int32 [B], not with present): entries n < visible[b] are the present ones."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.topk: triton is not installed (use topk_lowest_index_ref)")
    _check(scores, k, present, "topk_lowest_index")
    if visible is not None and (present is not None or visible.dtype != torch.int32 or not visible.is_contiguous()
                                or visible.shape != scores.shape[:1] or visible.device != scores.device):
        raise ValueError(f"topk_lowest_index: visible must be contiguous int32 [{scores.shape[0]}] on {scores.device}, "
                         f"without present, got {visible.dtype} {tuple(visible.shape)} on {visible.device}")
    if index_dtype not in (torch.int64, torch.int32):
        raise ValueError(f"topk_lowest_index: index_dtype must be int64 or int32, got {index_dtype}")
    picked = torch.empty(scores.shape[0], k, dtype=index_dtype, device=scores.device)
    valid = torch.empty(scores.shape[0], k, dtype=torch.bool, device=scores.device)
    _launch(scores, k, present, picked, valid, mark_absent, visible)
    return picked, valid


def _launch(scores: torch.Tensor, k: int, present: torch.Tensor | None, picked: torch.Tensor,
            valid: torch.Tensor, mark_absent: bool = False, visible: torch.Tensor | None = None) -> None:
    """The kernel into given [B, k] outputs (rows may be strided: the tests guard the slots past k)."""
    bsz, n = scores.shape
    if bsz == 0:
        return
    valid8 = valid.view(torch.uint8)  # a bool pointer would load/store as int1
    if present is not None:
        pres, strides = present.view(torch.uint8), present.stride()
    elif visible is not None:
        pres, strides = visible, (0, 0)
    else:  # (not read)
        pres, strides = valid8, valid8.stride()
    slices = split_slices(bsz, n, scores.dtype)
    if slices:
        _launch_split(scores, k, pres, strides, picked, valid8, slices, mark_absent, present is not None,
                      visible is not None)
        return
    block = block_for(n)
    strides = (scores.stride(0), scores.stride(1), *strides, picked.stride(0), valid8.stride(0))
    kw = dict(KEY16=scores.dtype != torch.float32, INF_BITS=INF_BITS[scores.dtype], HAS_PRESENT=present is not None,
              BLOCK=block, MARK_ABSENT=mark_absent, HAS_VISIBLE=visible is not None, num_warps=_warps(block))
    if SAMPLED and n >= SAMPLED_MIN_N:
        cap = min(n, SAMPLED_CAP_PER_K * k)
        listed = torch.empty(bsz, cap, dtype=torch.int32, device=scores.device)
        fit = dict(SBLOCK=block_for(triton.cdiv(n, SAMPLED_STRIDE)), LBLOCK=block_for(cap)) if SAMPLED_FIT else {}
        _topk_sampled_kernel[(bsz,)](scores, pres, picked, valid8, listed, n, k, cap, *strides, STRIDE=SAMPLED_STRIDE,
                                     GROUP=SAMPLED_GROUP, **fit, **kw)
    else:
        _topk_kernel[(bsz,)](scores, pres, picked, valid8, n, k, *strides, **kw)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else WARPS_LARGE


def split_slices(bsz: int, n: int, dtype: torch.dtype) -> int:
    """Slices per row for the split launches (0: one program per row): 16-bit keys, at most SPLIT_MAX_ROWS rows
    of at least SPLIT_MIN_N entries, that many more per further SPLIT_ROWS_PER_MIN rows."""
    if dtype == torch.float32 or bsz > SPLIT_MAX_ROWS or n < SPLIT_MIN_N * max(1, bsz // SPLIT_ROWS_PER_MIN):
        return 0
    return triton.cdiv(n, _slice_len(n))


def _slice_len(n: int) -> int:
    """Entries per slice: SPLIT_SLICE, or more where a row would pass SPLIT_MAX_SLICES slices."""
    if SPLIT_SLICE < 256 or SPLIT_SLICE & (SPLIT_SLICE - 1) or SPLIT_MAX_SLICES < 1:
        raise ValueError(f"topk.SPLIT_SLICE must be a power of two >= 256 and SPLIT_MAX_SLICES >= 1, got "
                         f"{SPLIT_SLICE} / {SPLIT_MAX_SLICES}")
    return max(SPLIT_SLICE, triton.next_power_of_2(triton.cdiv(n, SPLIT_MAX_SLICES)))


def _launch_split(scores, k, pres, strides, picked, valid8, slices, mark_absent, has_present, has_visible) -> None:
    bsz, n = scores.shape
    length = _slice_len(n)
    block = min(length, block_for(n))
    state = arrival_counters("topk split", scores.device, bsz * 513)  # TOT [B, 2, 256], then CNT [B]
    tot, cnt = state[:bsz * 512], state[bsz * 512:bsz * 513]
    rows = torch.empty(bsz, 2, slices, 256, dtype=torch.int32, device=scores.device)
    above = torch.empty(bsz, slices, dtype=torch.int32, device=scores.device)
    common = (n, k, length, scores.stride(0), scores.stride(1))
    warps = _warps(block)
    for p in (0, 1):
        _split_hist_kernel[(bsz, slices)](scores, tot, rows, above, *common, PASS=p, INF_BITS=INF_BITS[scores.dtype],
                                          BLOCK=block, num_warps=warps)
    _split_select_kernel[(bsz, slices)](
        scores, tot, cnt, rows, above, pres, picked, valid8, *common, *strides, picked.stride(0), valid8.stride(0),
        INF_BITS=INF_BITS[scores.dtype], HAS_PRESENT=has_present, BLOCK=block,
        SP=max(2, triton.next_power_of_2(slices)),
        MARK_ABSENT=mark_absent, HAS_VISIBLE=has_visible, num_warps=warps)
