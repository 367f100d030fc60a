"""The prefill MoE's activation requantisation (`moe_wide.requant_rows` / `dequantized_act`, per row and 128
channels, act_quant's e4m3 codes times pow2 scales) and the column order the Gluon GLU reads them in
(`permute_pairs`, moe_wide.PERM_K); interpreter-run in `make test`."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


@pytest.mark.parametrize("rows", [1, 37, 300])
def test_requant_rows_matches_dequantized_act(rows, poison):
    """`requant_rows` (in place, per row and 128 channels) and `dequantized_act` (out of place, one launch) give
    the act_quant codes times their scales bit for bit, over magnitudes from tiny (the 1e-4 amax floor) to
    large, and leave the other rows' memory (and the input) alone."""
    from dsv4.kernels.moe_wide import dequantized_act, dequantized_act_ref, permute_pairs, requant_rows

    gen = torch.Generator(DEV).manual_seed(rows)
    z = torch.randn(rows, 512, generator=gen, device=DEV)
    z *= torch.logspace(-6, 3, rows, device=DEV)[:, None]
    z = z.to(torch.bfloat16)
    buf = torch.full((rows + 3, 512), float("nan"), device=DEV, dtype=torch.bfloat16)
    buf[:rows] = z
    requant_rows(buf[:rows])
    ref = dequantized_act_ref(z)
    assert torch.equal(buf[:rows], ref)
    assert torch.isnan(buf[rows:]).all()
    z_before = z.clone()
    poison()
    assert torch.equal(dequantized_act(z), ref) and torch.equal(z, z_before)
    for perm in (1, 2):  # the columns in `pair_view` order, as the Gluon GLU reads them with moe_wide.PERM_K
        poison()
        assert torch.equal(dequantized_act(z, perm), permute_pairs(ref, perm)), perm
    with pytest.raises(ValueError, match="needs its own out"):
        requant_rows(buf[:rows], perm=1)


def test_permute_pairs_is_the_thread_order():
    """`permute_pairs`, built independently from index arithmetic: slot p + 4 i of each run of 4 * 2^perm column
    pairs holds pair 2^perm p + i (p < 4, i < 2^perm), both elements of the pair."""
    from dsv4.kernels.moe_wide import permute_pairs

    x = torch.randperm(256).view(2, 128)
    for perm in (0, 1, 2):
        n = 1 << perm
        run = 4 * n
        got = permute_pairs(x, perm)
        for slot in range(64):
            base, s = slot - slot % run, slot % run
            src = base + n * (s % 4) + s // 4
            assert torch.equal(got[:, 2 * slot:2 * slot + 2], x[:, 2 * src:2 * src + 2]), (perm, slot)
        assert not torch.equal(got, x) or perm == 0
