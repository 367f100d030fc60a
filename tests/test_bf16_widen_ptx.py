"""The Gluon MoE kernels' bf16 widening PTX (dsv4.kernels.moe_wide_async: SPREAD_PTX, BF16_LO_PTX, BF16_HI_PTX),
run on the CPU by a small interpreter of the five instructions it uses, for every 16-bit k-pair word and every
scale byte the wide kernels accept, against the e2m1 table times 2^(b - 127) in float64. The GPU test
(tests/gpu/test_moe_wide.py::test_gluon_widen_exhaustive) runs the same PTX on the H200; this one keeps the bit
recipe checked in CI, where no GPU is."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dsv4.kernels.moe_layout import WIDE_MAX_SCALE_BYTE
from dsv4.kernels.moe_wide_async import BF16_HI_PTX, BF16_LO_PTX, SPREAD_PTX

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of {b, a} (a: bytes 0-3)."""
    pool = [(a >> (8 * k)) & 0xFF for k in range(4)] + [(b >> (8 * k)) & 0xFF for k in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        src = (sel >> (4 * i)) & 0xF
        assert src < 8, "sign-replicate selectors are not used here"
        out |= pool[src] << (8 * i)
    return out


def _run(ptx: str, operands: dict[str, np.ndarray]) -> np.ndarray:
    """Interpret the asm block's instructions over uint64 arrays holding 32-bit values ($0 is the result)."""
    regs = dict(operands)

    def val(tok: str):
        return np.uint64(int(tok, 0)) if re.fullmatch(r"0x[0-9A-Fa-f]+|\d+", tok) else regs[tok]

    body = ptx.strip().strip("{}").split(";")
    for ins in (x.strip() for x in body):
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        if op == "cvt.u32.u16":
            regs[d] = val(src[0]) & np.uint64(0xFFFF)
        elif op == "prmt.b32":
            regs[d] = _prmt(val(src[0]), np.zeros_like(regs["$1"]) + val(src[1]), int(src[2], 0))
        elif op == "and.b32":
            regs[d] = val(src[0]) & val(src[1])
        elif op == "mul.lo.u32":
            regs[d] = (val(src[0]) * val(src[1])) & np.uint64(0xFFFFFFFF)
        elif op == "mul.rn.bf16x2":  # exact products only (asserted), so no rounding to emulate
            a, b = val(src[0]), val(src[1])
            halves = []
            for sh in (0, 16):
                p = _bf16_to_f64((a >> np.uint64(sh)) & np.uint64(0xFFFF)) * \
                    _bf16_to_f64((b >> np.uint64(sh)) & np.uint64(0xFFFF))
                f32 = p.astype(np.float32)
                bits = f32.view(np.uint32).astype(np.uint64) >> np.uint64(16)
                assert np.array_equal(_bf16_to_f64(bits), p), "a product that bf16 cannot hold exactly"
                halves.append(bits)
            regs[d] = halves[0] | (halves[1] << np.uint64(16))
        else:
            raise AssertionError(f"instruction {op} not interpreted")
    return regs["$0"]


@pytest.mark.parametrize("hi", [False, True])
def test_bf16_widening_ptx_is_exact_for_every_pair_and_scale(hi):
    words = np.arange(1 << 16, dtype=np.uint64)  # b0 | b1 << 8: every pair of weight bytes
    spread = _run(SPREAD_PTX, {"$1": words})
    assert np.array_equal(spread, (words & np.uint64(0xFF)) | ((words >> np.uint64(8)) << np.uint64(16)))
    b0, b1 = (words & np.uint64(0xFF)).astype(np.int64), (words >> np.uint64(8)).astype(np.int64)
    nib = (lambda b: b >> 4) if hi else (lambda b: b & 15)
    gen = np.random.default_rng(int(hi))
    for byte in range(WIDE_MAX_SCALE_BYTE + 1):  # every scale byte, each on a random quarter of the words
        pick = gen.random(words.size) < 0.25
        e = byte + 126  # the kernel's scale word: bf16x2 2^(b - 1)
        scale = np.full(int(pick.sum()), (e << 7) | (e << 23), dtype=np.uint64)
        out = _run(BF16_HI_PTX if hi else BF16_LO_PTX, {"$1": spread[pick], "$2": scale})
        for half, b in ((0, b0[pick]), (16, b1[pick])):
            c = nib(b)
            want = np.where(c & 8, -1.0, 1.0) * E2M1[c & 7] * 2.0 ** (byte - 127)
            got = _bf16_to_f64((out >> np.uint64(half)) & np.uint64(0xFFFF))
            assert np.array_equal(got, want), f"scale byte {byte}, half {half // 16}"
