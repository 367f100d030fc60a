"""dsv4.kernels.topk (one-launch radix-select top-k, listed ascending) vs its torch reference (the
stable descending sort, itself checked against brute force in tests/test_topk_ref.py), run on the CPU
copy so CUDA sort quirks cannot leak in: heavy ties, all-equal rows, -inf padded tails with their
present masks, signed zeros, NaNs of both signs, strided inputs, poisoned outputs, and guard slots
past k that must stay untouched."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
INTERP = os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter runs ~0.1 s per row: fewer rows there
FLAVOURS = ("ties", "spread", "tail", "flat")


def _nan(dtype: torch.dtype, negative: bool) -> torch.Tensor:
    """A quiet NaN with the sign bit set or clear, built on the bits (float math may canonicalise it)."""
    ints = torch.int16 if dtype.itemsize == 2 else torch.int32
    bits = torch.tensor([float("nan")], dtype=dtype).view(ints)
    sign = torch.tensor([-(1 << (8 * dtype.itemsize - 1))], dtype=ints)
    return (bits | sign if negative else bits & ~sign).view(dtype)


def _row(flavour: str, n: int, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One row of scores (on the CPU) and its present mask."""
    present = torch.rand(n, generator=gen) < 0.8
    if flavour == "ties":  # a few values, both zeros, both infinities, NaNs of both signs
        table = torch.tensor([-1.5, -0.0, 0.0, 0.25, 2.0, float("inf"), float("-inf")], dtype=dtype)
        s = table[torch.randint(0, len(table), (n,), generator=gen)]
        nans = torch.where(torch.rand(n, generator=gen) < 0.5, _nan(dtype, True), _nan(dtype, False))
        s = torch.where(torch.rand(n, generator=gen) < 0.02, nans, s)  # where copies the bits
    elif flavour == "flat":  # one value everywhere but a few -inf holes: the k-th key ties with all
        s = torch.full((n,), 0.5, dtype=dtype).masked_fill(~present, float("-inf"))
    else:  # relu'd weighted sums look like this: spread magnitudes, exact zeros, bf16 ties
        s = torch.relu(torch.randn(n, generator=gen) * torch.exp2(torch.randint(-4, 5, (n,), generator=gen).float()))
        s = s.to(dtype)
        if flavour == "tail":  # the decode layout: entries [0, count) real, -inf after, holes masked
            count = int(torch.randint(0, n + 1, (1,), generator=gen))
            present &= torch.arange(n) < count
            s = s.masked_fill(~present, float("-inf"))
    return s, present


def _case(bsz: int, n: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = [_row(FLAVOURS[(b + seed) % len(FLAVOURS)], n, dtype, gen) for b in range(bsz)]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def _assert_matches(scores: torch.Tensor, k: int, present: torch.Tensor | None, got, what: str) -> None:
    from dsv4.kernels.topk import topk_lowest_index_ref

    want_p, want_v = topk_lowest_index_ref(scores.cpu(), k, None if present is None else present.cpu())
    picked, valid = got
    assert picked.dtype == torch.int64 and valid.dtype == torch.bool, what
    assert picked.shape == valid.shape == (scores.shape[0], k), what
    bad = (picked.cpu() != want_p).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"{what}: picks differ in rows {bad[:8]}"
    assert torch.equal(valid.cpu().view(torch.uint8), want_v.view(torch.uint8)), f"{what}: valid differs"


def _assert_visible_picks(scores: torch.Tensor, k: int, visible: torch.Tensor, what: str) -> None:
    """topk_lowest_index with visible counts (int32 list, absent picks -1) against the reference's picks of the
    `entry < visible` mask."""
    from dsv4.kernels.topk import topk_lowest_index, topk_lowest_index_ref

    seen = torch.arange(scores.shape[1], device=scores.device)[None, :] < visible[:, None].long()
    picked, valid = topk_lowest_index(scores, k, mark_absent=True, visible=visible, index_dtype=torch.int32)
    want = topk_lowest_index_ref(scores.cpu(), k, seen.cpu())
    assert picked.dtype == torch.int32 and torch.equal(valid.cpu(), want[1]), what
    assert torch.equal(picked.long().cpu(), torch.where(want[1], want[0], -1)), what


def _ks(n: int) -> dict[str, int]:
    return {"1": 1, "512": min(512, n), "1024": min(1024, n), "N": n}  # 512: Flash's index_topk, 1024: Pro's


@pytest.mark.parametrize("kk", ["1", "512", "1024", "N"])
@pytest.mark.parametrize("n", [7, 256, 1000, 5000, 20000])
@pytest.mark.parametrize("bsz", [1, 3, 64])
def test_matches_reference(bsz: int, n: int, kk: str, poison) -> None:
    from dsv4.kernels.topk import topk_lowest_index

    if INTERP and ((bsz == 64 and (n, kk) != (256, "512")) or (n == 20000 and kk != "512" and bsz > 1)):
        pytest.skip("interpreter: too slow for this size (runs on the GPU)")
    k = _ks(n)[kk]
    scores, present = _case(bsz, n, torch.bfloat16, seed=n * 7 + bsz + len(kk) + k)
    scores, present = scores.to(DEV), present.to(DEV)
    poison()
    _assert_matches(scores, k, present, topk_lowest_index(scores, k, present), f"B={bsz} N={n} k={k}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [300, 5000])
def test_other_dtypes(dtype: torch.dtype, n: int, poison) -> None:
    from dsv4.kernels.topk import topk_lowest_index

    scores, present = _case(4, n, dtype, seed=n + dtype.itemsize)
    scores, present = scores.to(DEV), present.to(DEV)
    for k in (1, 200, n):
        poison()
        _assert_matches(scores, k, present, topk_lowest_index(scores, k, present), f"{dtype} N={n} k={k}")


@pytest.mark.parametrize("n", [50, 4100])
def test_without_present_all_valid(n: int, poison) -> None:
    from dsv4.kernels.topk import topk_lowest_index

    scores, _ = _case(3, n, torch.bfloat16, seed=n + 11)
    scores = scores.to(DEV)
    poison()
    got = topk_lowest_index(scores, min(512, n))
    _assert_matches(scores, min(512, n), None, got, f"N={n} without present")
    assert bool(got[1].all())


@pytest.mark.parametrize("n, k", [(40, 30), (3000, 512)])
def test_mark_absent(n: int, k: int, poison) -> None:
    """mark_absent: the same picks and valid flags, the picks that are not present stored as -1 (rows with absent
    entries among their picks: k near N, and present thinned)."""
    from dsv4.kernels.topk import topk_lowest_index

    scores, present = _case(4, n, torch.bfloat16, seed=n + k)
    present &= torch.rand(present.shape, generator=torch.Generator().manual_seed(n)) < 0.7
    scores, present = scores.to(DEV), present.to(DEV)
    poison()
    picked, valid = topk_lowest_index(scores, k, present, mark_absent=True)
    plain = topk_lowest_index(scores, k, present)
    _assert_matches(scores, k, present, plain, f"N={n} k={k}")
    assert torch.equal(valid, plain[1]) and bool((~valid).any())
    assert torch.equal(picked, torch.where(plain[1], plain[0], -1))


@pytest.mark.parametrize("n, k", [(40, 30), (3000, 512)])
def test_visible_counts(n: int, k: int, poison) -> None:
    """visible (a prompt chunk's causal entry counts, -inf past them as the prefill scores have): the picks of the
    `present = n < visible` mask, the absent ones -1, int32 when asked; counts of 0, < k, and N among the rows."""
    from dsv4.kernels.topk import topk_lowest_index

    scores, _ = _case(5, n, torch.bfloat16, seed=3 * n + k)
    visible = torch.tensor([0, k // 3, k, n - 1, n], dtype=torch.int32)
    present = torch.arange(n)[None, :] < visible[:, None].long()
    scores = scores.masked_fill(~present, float("-inf"))
    scores, present, visible = scores.to(DEV), present.to(DEV), visible.to(DEV)
    poison()
    plain = topk_lowest_index(scores, k, present)
    _assert_matches(scores, k, present, plain, f"N={n} k={k}")
    for dtype in (torch.int64, torch.int32):
        picked, valid = topk_lowest_index(scores, k, mark_absent=True, visible=visible, index_dtype=dtype)
        assert picked.dtype == dtype and torch.equal(valid, plain[1])
        assert torch.equal(picked.long(), torch.where(plain[1], plain[0], -1))
    assert bool((~plain[1]).any()) and bool(plain[1].any())
    with pytest.raises(ValueError, match="visible must be contiguous int32"):
        topk_lowest_index(scores, k, present, visible=visible)
    with pytest.raises(ValueError, match="visible must be contiguous int32"):
        topk_lowest_index(scores, k, visible=visible.long())
    with pytest.raises(ValueError, match="visible must be contiguous int32"):
        topk_lowest_index(scores, k, visible=visible.repeat(2)[::2])
    with pytest.raises(ValueError, match="index_dtype"):
        topk_lowest_index(scores, k, visible=visible, index_dtype=torch.int16)


def test_strided_inputs(poison) -> None:
    """Row and column strides of the scores and of present are honoured (a transposed view)."""
    from dsv4.kernels.topk import topk_lowest_index

    scores, present = _case(5, 600, torch.bfloat16, seed=5)
    scores_t = scores.t().contiguous().to(DEV).t()  # strides (1, 5)
    present_t = present.t().contiguous().to(DEV).t()
    assert scores_t.stride(1) != 1 and present_t.stride(1) != 1
    poison()
    _assert_matches(scores, 300, present, topk_lowest_index(scores_t, 300, present_t), "transposed views")


@pytest.mark.parametrize("n, k", [(7, 3), (300, 1), (5000, 512), (9000, 9000)])
def test_writes_exactly_k_slots(n: int, k: int) -> None:
    """Output rows with guard columns after slot k: over-selection (say of tied keys) would land there."""
    from dsv4.kernels.topk import _launch

    scores, present = _case(3, n, torch.bfloat16, seed=n + k)
    scores, present = scores.to(DEV), present.to(DEV)
    guard = 4096
    picked = torch.full((3, k + guard), -7, dtype=torch.int64, device=DEV)
    valid = torch.full((3, k + guard), 3, dtype=torch.uint8, device=DEV).view(torch.bool)
    _launch(scores, k, present, picked[:, :k], valid[:, :k])
    assert bool((picked[:, k:] == -7).all()) and bool((valid[:, k:].view(torch.uint8) == 3).all()), "guard written"
    _assert_matches(scores, k, present, (picked[:, :k], valid[:, :k]), f"guarded N={n} k={k}")


@pytest.mark.skipif(INTERP, reason="interpreter: a 262144-entry row takes minutes")
@pytest.mark.parametrize("k", [512, 262144])
def test_million_token_row(k: int, poison) -> None:
    """N = 262144 (1M context / 4): 64 chunks carried through every pass."""
    from dsv4.kernels.topk import topk_lowest_index

    scores, present = _case(2, 262144, torch.bfloat16, seed=k)
    scores, present = scores.to(DEV), present.to(DEV)
    poison()
    _assert_matches(scores, k, present, topk_lowest_index(scores, k, present), f"N=262144 k={k}")


def test_bad_arguments_rejected() -> None:
    from dsv4.kernels.topk import topk_lowest_index

    scores = torch.randn(2, 40, device=DEV).to(torch.bfloat16)
    for k in (0, 41):
        with pytest.raises(ValueError, match="k must be"):
            topk_lowest_index(scores, k)
    with pytest.raises(ValueError, match="present"):
        topk_lowest_index(scores, 3, torch.ones(2, 40, dtype=torch.bool, device=DEV)[:, :39])


@pytest.mark.parametrize("block_max", [128, 1 << 16])
def test_chunk_setting_out_of_range_rejected(block_max: int, monkeypatch) -> None:
    """topk.BLOCK_MAX past what the select pass can count (2^16 keys a chunk: ties in an int32's high half) or below
    the histogram's 256 bins is a clear error, not wrong picks."""
    from dsv4.kernels import topk

    monkeypatch.setattr(topk, "BLOCK_MAX", block_max)
    scores = torch.randn(2, 300, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match="BLOCK_MAX"):
        topk.topk_lowest_index(scores, 3)


@pytest.mark.parametrize("bsz, n, k, max_slices, dtype", [
    (1, 1000, 512, 64, torch.bfloat16), (3, 1300, 1, 64, torch.bfloat16), (2, 2000, 2000, 3, torch.bfloat16),
    (4, 700, 300, 64, torch.float16), (5, 257, 256, 64, torch.bfloat16)])
def test_split_rows(bsz: int, n: int, k: int, max_slices: int, dtype: torch.dtype, poison, monkeypatch) -> None:
    """Rows split into slices (three launches of (row, slice) programs): the reference's picks with present masks,
    mark_absent and visible counts, for every flavour of row, slices of 256 (and wider ones where max_slices
    caps the count: 2000 entries in 2 slices of 1024), a last slice of one entry."""
    from dsv4.kernels import topk

    monkeypatch.setattr(topk, "SPLIT_MIN_N", 256)
    monkeypatch.setattr(topk, "SPLIT_SLICE", 256)
    monkeypatch.setattr(topk, "SPLIT_MAX_SLICES", max_slices)
    slices = topk.split_slices(bsz, n, dtype)
    assert 1 < slices <= max_slices and (slices == -(-n // 256) or max_slices < -(-n // 256))
    scores, present = _case(bsz, n, dtype, seed=n + k + bsz)
    scores, present = scores.to(DEV), present.to(DEV)
    poison()
    plain = topk.topk_lowest_index(scores, k, present)
    _assert_matches(scores, k, present, plain, f"split B={bsz} N={n} k={k}")
    picked, valid = topk.topk_lowest_index(scores, k, present, mark_absent=True)
    assert torch.equal(valid, plain[1]) and torch.equal(picked, torch.where(plain[1], plain[0], -1))
    visible = torch.randint(0, n + 1, (bsz,), generator=torch.Generator().manual_seed(n), dtype=torch.int32).to(DEV)
    _assert_visible_picks(scores, k, visible, f"visible B={bsz} N={n} k={k}")
    # the row totals and arrival counters are left zeroed for the next call (their last program resets them)
    from dsv4.kernels._triton import arrival_counters
    assert not bool(arrival_counters("topk split", scores.device, 1).any()), "split state left non-zero"


@pytest.mark.skipif(INTERP, reason="interpreter: long rows on one program are slow (the split default covers them)")
@pytest.mark.parametrize("n", [5000, 20000])
def test_one_program_long_rows(n: int, poison, monkeypatch) -> None:
    """Rows the split launches would take by default (few and long), on one program per row as before."""
    from dsv4.kernels import topk

    monkeypatch.setattr(topk, "SPLIT_MIN_N", 1 << 30)
    assert topk.split_slices(3, n, torch.bfloat16) == 0
    scores, present = _case(3, n, torch.bfloat16, seed=n + 5)
    scores, present = scores.to(DEV), present.to(DEV)
    poison()
    _assert_matches(scores, 512, present, topk.topk_lowest_index(scores, 512, present), f"one program N={n}")


def test_split_rule(monkeypatch) -> None:
    """Which rows split: 16-bit keys, few rows, long rows; slices widen past SPLIT_MAX_SLICES; bad settings fail."""
    from dsv4.kernels import topk

    n = 4 * topk.SPLIT_MIN_N
    assert topk.split_slices(1, n, torch.bfloat16) == n // topk.SPLIT_SLICE
    assert topk.split_slices(topk.SPLIT_MAX_ROWS, 2 * topk.SPLIT_MIN_N, torch.float16) == 0  # more rows: longer
    many = topk.SPLIT_MIN_N * (topk.SPLIT_MAX_ROWS // topk.SPLIT_ROWS_PER_MIN)
    assert topk.split_slices(topk.SPLIT_MAX_ROWS, many, torch.float16) > 0
    assert topk.split_slices(topk.SPLIT_MAX_ROWS, many - 1, torch.float16) == 0
    assert topk.split_slices(topk.SPLIT_ROWS_PER_MIN, topk.SPLIT_MIN_N, torch.bfloat16) > 0
    assert topk.split_slices(topk.SPLIT_MAX_ROWS + 1, n, torch.bfloat16) == 0
    assert topk.split_slices(1, topk.SPLIT_MIN_N - 1, torch.bfloat16) == 0
    assert topk.split_slices(1, n, torch.float32) == 0  # (4 digits: the one-program kernel)
    assert topk.split_slices(1, 1 << 20, torch.bfloat16) == topk.SPLIT_MAX_SLICES
    monkeypatch.setattr(topk, "SPLIT_SLICE", 300)
    with pytest.raises(ValueError, match="SPLIT_SLICE"):
        topk.split_slices(1, n, torch.bfloat16)


@pytest.mark.parametrize("n, k, cap_per_k, stride, group, fit", [
    (3000, 64, 4, 16, 8, True),  # the listed keys' path (about 2k of them)
    (2500, 512, 4, 16, 1, False),  # k near the list's expected size
    (3000, 64, 1, 16, 1, True),  # a list past its cap: the plain passes
    (2000, 1990, 4, 16, 8, False),  # k near N: fewer listed keys than k happen
    (1200, 100, 4, 4096, 4, True)])  # a one-entry sample
def test_sampled_rows(n: int, k: int, cap_per_k: int, stride: int, group: int, fit: bool, poison,
                      monkeypatch) -> None:
    """topk.SAMPLED (on from SAMPLED_MIN_N entries; here from 1024): the reference's picks, with present masks,
    mark_absent and visible counts, on every flavour of row (the flat rows list every key: past the cap, the plain
    passes); the listing's scan flat or by groups, the sample's and the list's chunks the row's or fitted."""
    from dsv4.kernels import topk

    monkeypatch.setattr(topk, "SAMPLED", True)
    monkeypatch.setattr(topk, "SAMPLED_GROUP", group)
    monkeypatch.setattr(topk, "SAMPLED_FIT", fit)
    monkeypatch.setattr(topk, "SAMPLED_MIN_N", 1024)
    monkeypatch.setattr(topk, "SAMPLED_CAP_PER_K", cap_per_k)
    monkeypatch.setattr(topk, "SAMPLED_STRIDE", stride)
    monkeypatch.setattr(topk, "SPLIT_MAX_ROWS", 0)
    scores, present = _case(4, n, torch.bfloat16, seed=n + k + stride)
    scores, present = scores.to(DEV), present.to(DEV)
    poison()
    plain = topk.topk_lowest_index(scores, k, present)
    _assert_matches(scores, k, present, plain, f"sampled N={n} k={k}")
    visible = torch.tensor([0, k, n // 2, n], dtype=torch.int32, device=DEV)
    seen = torch.arange(n, device=DEV)[None, :] < visible[:, None].long()
    _assert_visible_picks(scores.masked_fill(~seen, float("-inf")), k, visible, f"sampled visible N={n} k={k}")
