"""The two-pass greedy pick (dsv4.engine.sampler.first_argmax) on the GPU: the same ids as torch's argmax
(the first maximum; NaN the largest) on fresh random logits with many ties, at decode batch sizes."""
from __future__ import annotations

import math
import os

import pytest
import torch

from dsv4.engine.sampler import first_argmax

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("kind", ["normal", "ties", "nan"])
def test_first_argmax_matches_argmax(batch, kind):
    gen = torch.Generator(device=DEV).manual_seed(batch * 7 + len(kind))
    x = torch.randn(batch, 129280, device=DEV, generator=gen)
    if kind == "ties":
        x = (x * 2).round()  # the row maximum repeated, often in several pieces
    elif kind == "nan":
        cols = torch.randint(0, 129280, (batch, 2), device=DEV, generator=gen)
        x.scatter_(1, cols, math.nan)
    want = x.argmax(-1)
    got = first_argmax(x)
    assert torch.equal(got, want)
    if kind == "ties":  # the pick is the first column holding the row maximum
        first = (x == x.max(-1, keepdim=True).values).int().argmax(-1)
        assert torch.equal(got, first)
