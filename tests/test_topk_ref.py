"""dsv4.kernels.topk's torch reference (the indexer's stable-descending-sort top-k, listed ascending)
against a brute-force Python definition: rank by (NaN first, score descending, index ascending),
where -0.0 == +0.0 and -inf ranks last. Ties are made common by drawing from a few values."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4.kernels.topk import topk_lowest_index_ref

# Few distinct values so most scores tie; both zeros, both infinities and NaN of both sign bits.
VALUES = [-2.5, -0.5, -0.0, 0.0, 0.75, 3.0, float("inf"), float("-inf")]


def _nan(dtype: torch.dtype, negative: bool) -> torch.Tensor:
    """A quiet NaN with the sign bit set or clear, built on the bits (float math may canonicalise it)."""
    ints = torch.int16 if dtype.itemsize == 2 else torch.int32
    bits = torch.tensor([float("nan")], dtype=dtype).view(ints)
    sign = torch.tensor([-(1 << (8 * dtype.itemsize - 1))], dtype=ints)
    return (bits | sign if negative else bits & ~sign).view(dtype)


def _brute(row: list[float], present: list[bool] | None, k: int) -> tuple[list[int], list[bool]]:
    order = sorted(range(len(row)), key=lambda i: (not math.isnan(row[i]), 0.0 if math.isnan(row[i]) else -row[i], i))
    picked = sorted(order[:k])
    return picked, [True] * k if present is None else [present[i] for i in picked]


def _draw(bsz: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    table = torch.tensor(VALUES, dtype=dtype)
    s = table[torch.randint(0, len(VALUES), (bsz, n), generator=gen)]
    s[0] = torch.randn(n, generator=gen).to(dtype)  # one row of spread values (bf16 still ties some)
    nan_at = torch.rand(bsz, n, generator=gen) < 0.05
    nans = torch.where(torch.rand(bsz, n, generator=gen) < 0.5, _nan(dtype, True), _nan(dtype, False))
    s = torch.where(nan_at, nans, s)  # where copies bits; an indexed assignment canonicalises the NaN
    if bsz > 1:  # an absent tail, as the decode path pads rows with -inf
        s[1, int(torch.randint(0, n + 1, (1,), generator=gen)):] = float("-inf")
    if bsz > 2:
        s[2] = float("-inf")
    return s


def _check_against_brute(s: torch.Tensor, k: int, present: torch.Tensor | None) -> None:
    picked, valid = topk_lowest_index_ref(s, k, present)
    assert picked.dtype == torch.int64 and valid.dtype == torch.bool and picked.shape == valid.shape == (s.shape[0], k)
    for b in range(s.shape[0]):
        want_p, want_v = _brute(s[b].tolist(), None if present is None else present[b].tolist(), k)
        assert picked[b].tolist() == want_p, f"row {b}: {s[b].tolist()} k={k}"
        assert valid[b].tolist() == want_v, f"row {b} valid"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [1, 7, 64, 300])
def test_reference_matches_brute_force(dtype: torch.dtype, n: int) -> None:
    gen = torch.Generator().manual_seed(1000 * n + dtype.itemsize)
    s = _draw(4, n, dtype, gen)
    present = torch.rand(4, n, generator=gen) < 0.7
    for k in sorted({1, max(1, n // 3), max(1, n - 1), n}):
        _check_against_brute(s, k, present)
        _check_against_brute(s, k, None)


def test_signed_zeros_tie_by_index() -> None:
    """-0.0 before +0.0 in index order and the other way round: equal, so the lower index wins."""
    s = torch.tensor([[-0.0, 0.0, -1.0, -0.0, 0.0], [0.0, -0.0, -1.0, 0.0, -0.0]], dtype=torch.bfloat16)
    for k in range(1, 6):
        picked, _ = topk_lowest_index_ref(s, k)
        zeros = [0, 1, 3, 4]
        want = sorted(zeros[:k]) if k <= 4 else [0, 1, 2, 3, 4]
        assert picked[0].tolist() == want and picked[1].tolist() == want


def test_nan_ranks_above_inf_both_signs() -> None:
    assert int(_nan(torch.bfloat16, True).view(torch.int16)) < 0 <= int(_nan(torch.bfloat16, False).view(torch.int16))
    s = torch.tensor([[1.0, float("inf"), 0.0, 0.0, 2.0]], dtype=torch.bfloat16).repeat(2, 1)
    s[0, 3] = _nan(torch.bfloat16, negative=True)
    s[1, 3] = _nan(torch.bfloat16, negative=False)
    for row in range(2):
        assert topk_lowest_index_ref(s[row:row + 1], 1)[0].tolist() == [[3]]
        assert topk_lowest_index_ref(s[row:row + 1], 2)[0].tolist() == [[1, 3]]


def test_present_gathered_at_picks() -> None:
    gen = torch.Generator().manual_seed(7)
    s = torch.randn(3, 50, generator=gen).to(torch.bfloat16)
    present = torch.rand(3, 50, generator=gen) < 0.5
    picked, valid = topk_lowest_index_ref(s, 20, present)
    assert torch.equal(valid, torch.gather(present, 1, picked))
    assert bool(topk_lowest_index_ref(s, 20)[1].all())


@pytest.mark.parametrize("bad_k", [0, -1, 51, True, 2.0])
def test_bad_k_rejected(bad_k) -> None:
    s = torch.zeros(2, 50, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k must be"):
        topk_lowest_index_ref(s, bad_k)


def test_bad_tensors_rejected() -> None:
    s = torch.randn(2, 10).to(torch.bfloat16)
    with pytest.raises(ValueError, match="scores"):
        topk_lowest_index_ref(s[0], 3)
    with pytest.raises(ValueError, match="scores"):
        topk_lowest_index_ref(s.to(torch.int32), 3)
    with pytest.raises(ValueError, match="present"):
        topk_lowest_index_ref(s, 3, torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="present"):
        topk_lowest_index_ref(s, 3, torch.ones(2, 10, dtype=torch.uint8))
