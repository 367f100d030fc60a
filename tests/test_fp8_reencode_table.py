"""The MXFP4 -> e4m3 re-encode of dsv4.kernels.moe_wide_fp8, checked on the CPU where it is plain data:
its prmt table (T8_LO / T8_HI) less d per exponent field must be e4m3 bytes of e2m1(code) * 2^(6 - d) for every
code and every d the exactness rule admits, and `fp8_reencode_ok` must admit exactly those blocks."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.moe_layout import FP8_MAX_SCALE_SPREAD, FP8_MIN_BLOCK_SCALE, fp8_reencode_ok
from dsv4.kernels.moe_wide_fp8 import T8_HI, T8_LO

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e4m3(byte: int) -> float:
    return float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).double())


@pytest.mark.parametrize("d", range(FP8_MAX_SCALE_SPREAD + 1))
def test_table_less_d_is_e2m1_times_2_to_6_minus_d(d):
    for code in range(16):
        mag, neg = code & 7, code >= 8
        byte = ((T8_HI if mag >= 4 else T8_LO) >> (8 * (mag % 4))) & 0xFF
        if byte:
            byte -= 8 * d  # the asm's d * 0x08080800 / 0x08080808: byte 0 (code 0) of the low word stays 0
        byte |= 0x80 if neg else 0
        want = E2M1[mag] * 2.0 ** (6 - d) * (-1 if neg else 1)
        assert _e4m3(byte) == want or (want == 0 and _e4m3(byte) == 0), (code, d, hex(byte))


def test_one_more_step_would_leave_the_normal_range():
    """d = 12 takes code 1 (0.5) below e4m3's smallest normal: the field subtraction would reach 0, which is
    why FP8_MAX_SCALE_SPREAD is 11."""
    byte = ((T8_LO >> 8) & 0xFF) - 8 * (FP8_MAX_SCALE_SPREAD + 1)
    assert byte >> 3 == 0


def _blocks(spread: int, bmax: int, rows: int = 3) -> torch.Tensor:
    """[rows, 8] scale bytes: two 128-wide blocks, the first with exactly this spread and largest byte."""
    b = torch.full((rows, 8), bmax, dtype=torch.uint8)
    b[:, 1] = bmax - spread
    return b


@pytest.mark.parametrize("spread,bmax,ok", [(0, 127, True), (FP8_MAX_SCALE_SPREAD, 127, True),
                                            (FP8_MAX_SCALE_SPREAD + 1, 127, False),
                                            (0, FP8_MIN_BLOCK_SCALE, True), (0, FP8_MIN_BLOCK_SCALE - 1, False)])
def test_reencode_ok_admits_exactly_the_rule(spread, bmax, ok):
    assert fp8_reencode_ok(_blocks(spread, bmax)) is ok


def test_reencode_ok_looks_at_every_block_separately():
    """Bytes 20 apart in different blocks are fine; within one block they are not."""
    b = torch.tensor([[120, 120, 120, 120, 100, 100, 100, 100]], dtype=torch.uint8)
    assert fp8_reencode_ok(b)
    b[0, 3] = 100
    assert not fp8_reencode_ok(b)
