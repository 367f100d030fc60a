"""The fold of the indexer's FP4-simulated rows to e4m3 (dsv4.kernels.indexer_fp8.fold_rows_ref) re-derived in
float64: exact rows and the scale identity the FP8 prefill scores rest on, the bound on the blocks' spread, rows that
must not fold."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.indexer_fp8 import fold_rows_ref
from dsv4.model.numerics import simulate_indexer_fp4


def _fp4_rows(rows: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, 128, generator=gen) * torch.exp2(torch.randint(-12, 12, (rows, 1), generator=gen).float())
    x[::7, :8] *= 30.0  # some large channels before the rotation
    return simulate_indexer_fp4(x.to(torch.bfloat16))


def test_fp4_rows_fold_exactly_and_keep_every_dot():
    gen = torch.Generator().manual_seed(11)
    q, k = _fp4_rows(96, gen), _fp4_rows(80, gen)
    w = torch.randn(96, generator=gen) * 0.01
    q8, sq, okq = fold_rows_ref(q, w)
    k8, sk, okk = fold_rows_ref(k)
    assert okq and okk
    qs = sq.double() / w.double()  # 2^a per q row
    assert torch.equal(q8.double() * qs[:, None], q.double())
    assert torch.equal(k8.double() * sk.double()[:, None], k.double())
    assert torch.equal(torch.log2(qs), torch.round(torch.log2(qs)))  # powers of two
    amax = k8.double().abs().amax(1)
    assert bool(((amax >= 128) & (amax < 256)).all())
    # the identity of the FP8 scores: every dot is 2^(a_q + a_k) times the folded operands' dot, in float64 exactly
    assert torch.equal(q.double() @ k.double().T, (q8.double() @ k8.double().T) * qs[:, None] * sk.double()[None, :])


@pytest.mark.parametrize("spread,ok", [(13, True), (20, False)])
def test_blocks_far_apart_do_not_fold(spread, ok):
    """A row whose blocks' scales lie 2^spread apart: exact in e4m3 up to 13, not at 20 (its small block's values
    would round); one such row clears the whole call's flag."""
    gen = torch.Generator().manual_seed(spread)
    x = _fp4_rows(8, gen).float()
    x[3, 32:64] = torch.tensor([6.0, 0.5, -1.5, 3.0] * 8) * 2.0 ** -spread * x[3].abs().amax() / 6.0
    x = x.to(torch.bfloat16)
    x8, s, got = fold_rows_ref(x)
    assert got is ok
    assert torch.equal(x8[3].double() * s[3].double(), x[3].double()) is ok


def test_zero_rows_tiny_rows_and_weights_out_of_range():
    gen = torch.Generator().manual_seed(5)
    x = _fp4_rows(4, gen)
    x[1] = 0
    x8, s, ok = fold_rows_ref(x)
    assert ok and not x8[1].float().any() and s[1] == 1.0
    tiny = x.clone()
    row = tiny[2].float()
    tiny[2] = (row / row.abs().amax() * 2.0 ** -110).to(torch.bfloat16)  # largest magnitude below 2^-100
    assert not fold_rows_ref(tiny)[2]
    w = torch.ones(4)
    w[0] = 2.0 ** 127  # w 2^a leaves fp32's range for a row with a > 0
    big = x.clone()
    big[0] = (big[0].float() * 2.0 ** 20).to(torch.bfloat16)
    assert fold_rows_ref(x, torch.ones(4))[2] and not fold_rows_ref(big, w)[2]
