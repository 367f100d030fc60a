"""The host side of the persistent FP8 GEMV (`dsv4.kernels.fp8_gemv_stream`, prepared for the GPU): its choice of
K split (re-derived from its rule over many shapes) and its shape checks (a clear error naming the operand). CPU
only."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4.kernels import fp8_gemv_stream as g


def test_pick_split_rule():
    rng = random.Random(99)
    for _ in range(300):
        n, k, sms = 64 * rng.randint(1, 600), 128 * rng.randint(1, 130), rng.choice([78, 114, 132])
        s = g.pick_split(n, k, sms)
        kb, tiles = k // 128, n // 64
        assert kb % s == 0
        enough = [d for d in range(1, kb + 1) if kb % d == 0 and tiles * d >= sms * g.UNITS_PER_PROGRAM]
        assert s == (min(enough) if enough else kb), (n, k, sms, s)


def test_released_linears_get_work_for_every_sm():
    for n, k in [(1024, 4096), (512, 4096), (32768, 1024), (4096, 8192), (1536, 7168), (7168, 16384)]:
        s = g.pick_split(n, k, 132)
        assert (n // 64) * s >= 132 or s == k // 128, (n, k, s)


def test_checks_name_the_operand():
    x = torch.randn(1, 256).to(torch.bfloat16)
    w = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    s = torch.zeros(1, 2, dtype=torch.uint8)
    g.check(x, w, s)  # the shapes it takes
    with pytest.raises(ValueError, match="x must be bf16"):
        g.check(torch.randn(9, 256).to(torch.bfloat16), w, s)
    with pytest.raises(ValueError, match="x must be bf16"):
        g.check(torch.randn(1, 256), w, s)
    with pytest.raises(ValueError, match="weight must be contiguous e4m3"):
        g.check(x, torch.zeros(100, 256, dtype=torch.float8_e4m3fn), s)
    with pytest.raises(ValueError, match="weight must be contiguous e4m3"):
        g.check(x, w.to(torch.bfloat16), s)
    with pytest.raises(ValueError, match="scale must be E8M0 or float32"):
        g.check(x, w, torch.zeros(1, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="scale must be E8M0 or float32"):
        g.check(x, w, torch.zeros(1, 2, dtype=torch.bfloat16))
