"""e2m1 -> f16 bit move of the tensor-core MoE decode path (dsv4.kernels.moe_gemv, method "mma"): the mapping
(s << 15) | (c << 9) against the e2m1 value table, and the kernel's inline PTX, run by a small evaluator of the
five instructions it uses, over every byte value in every byte position."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _e2m1_table() -> list[float]:
    """The 16 e2m1 values from the format: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0,
    exponent 0 subnormal (0.m * 2^0)."""
    out = []
    for code in range(16):
        s, e, m = code >> 3, (code >> 1) & 3, code & 1
        mag = m / 2 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
        out.append(-mag if s else mag)
    return out


def test_e2m1_table_is_the_project_table():
    from dsv4.quant.mxfp4 import E2M1_VALUES

    table = torch.tensor(_e2m1_table(), dtype=torch.float64)
    assert torch.equal(table, E2M1_VALUES.double())
    assert bool(torch.signbit(table[8])) and not bool(torch.signbit(table[0]))


def test_f16_bits_are_e2m1_times_2_pow_minus_14():
    """Exhaustive: every code (subnormal 0.5 and both zeros included) is exactly e2m1 * 2^-14 in f16."""
    table = _e2m1_table()
    for code in range(16):
        bits = ((code >> 3) << 15) | ((code & 7) << 9)
        v = torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16)
        want = torch.tensor([table[code] * 2.0**-14], dtype=torch.float64)
        assert float(v.double() - want) == 0.0, f"code {code}: {float(v)} != {float(want)}"
        assert bool(torch.signbit(v)) == bool(code >> 3), f"code {code}: sign"
    assert float(torch.tensor([1 << 9], dtype=torch.int16).view(torch.float16)) < 2.0**-14  # c = 1 is subnormal


_MASK = 0xFFFFFFFF


def _run_ptx(asm: str, regs: dict) -> dict:
    """Evaluate straight-line PTX on 32-bit values (regs: name -> int): the instructions the kernel uses."""
    body = asm.strip()
    assert body[0] == "{" and body[-1] == "}", asm
    regs = dict(regs)
    for stmt in body[1:-1].split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        dst, *args = [a.strip() for a in rest.split(",")]
        v = [regs[a] if a in regs else int(a, 0) for a in args]
        if op == "shl.b32":
            r = (v[0] << v[1]) & _MASK
        elif op == "shr.u32":
            r = v[0] >> v[1]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "lop3.b32":  # bit i of the result: bit (a_i b_i c_i) of the truth table
            a, b, c, lut = v
            r = sum(((lut >> (((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1))) & 1) << i
                    for i in range(32))
        elif op == "prmt.b32":  # byte i of the result: byte sel_i & 7 of {b, a}, msb of sel_i: replicate its sign
            src, r = v[0] | (v[1] << 32), 0
            for i in range(4):
                sel = (v[2] >> (4 * i)) & 0xF
                byte = (src >> (8 * (sel & 7))) & 0xFF
                if sel & 8:
                    byte = 0xFF if byte & 0x80 else 0
                r |= byte << (8 * i)
        else:
            raise AssertionError(f"evaluator: unsupported instruction {op!r}")
        regs[dst] = r
    return regs


def test_ptx_evaluator_prmt_and_lop3():
    """The evaluator itself, on cases worked out by hand from the PTX ISA definitions."""
    r = _run_ptx("{ prmt.b32 $0, $1, $2, 0x7531; prmt.b32 $3, $5, 0, 0x193A; lop3.b32 $4, $1, $2, 0xFF00FF00, 0xEA; "
                 "shr.u32 $6, $5, 4; shl.b32 $7, $5, 4; }", {"$1": 0x33221100, "$2": 0x77665544, "$5": 0x80FF7F01})
    assert r["$0"] == 0x77553311  # bytes 1, 3, 5, 7 of {b, a}
    assert r["$3"] == 0x7F0080FF  # sign of byte 2 (0xFF), byte 3, sign of byte 1 (0x7F), byte 1
    assert r["$4"] == (0x33221100 & 0x77665544) | 0xFF00FF00  # 0xEA: (a & b) | c
    assert r["$6"] == 0x080FF7F0 and r["$7"] == 0x0FF7F010


@pytest.mark.parametrize("which", ["lo", "hi"])
def test_nibble_ptx_exhaustive(which):
    """Every byte value in every position of the packed word: element j (byte j) -> f16 of e2m1(nibble) * 2^-14,
    elements 0, 1 in $0 and 2, 3 in $1 (low half first), the packing Triton uses for pack=4."""
    from dsv4.kernels.moe_mma_operands import F16_HI_PTX, F16_LO_PTX

    asm = F16_LO_PTX if which == "lo" else F16_HI_PTX
    f16_bits = [int(np.float16(v * 2.0**-14).view(np.uint16)) for v in _e2m1_table()]
    for b in range(256):
        word_bytes = [b, (b * 7 + 3) & 0xFF, (b * 13 + 5) & 0xFF, (b * 29 + 11) & 0xFF]  # odd multipliers: each
        word = sum(x << (8 * j) for j, x in enumerate(word_bytes))  # position sees all 256 values
        r = _run_ptx(asm, {"$2": word})
        got = [r["$0"] & 0xFFFF, r["$0"] >> 16, r["$1"] & 0xFFFF, r["$1"] >> 16]
        want = [f16_bits[x & 0xF if which == "lo" else x >> 4] for x in word_bytes]
        assert got == want, f"{which} word {word:#010x}: {[hex(g) for g in got]} != {[hex(w) for w in want]}"
