"""The MXFP4 -> e4m3 re-encode of dsv4.kernels.e4m3_reencode, checked on the CPU where it is plain data:
its prmt table (T8_LO / T8_HI) less d per exponent field must be e4m3 bytes of e2m1(code) * 2^(6 - d) for every
code and every d the exactness rule admits; its PTX (`e4m3_pair_asm`, run here by a small interpreter of the
few integer instructions it uses) must give those bytes for every packed byte value in every lane and every
pair of group spreads; and `fp8_tiles` must admit exactly those tiles (one row: the rule per 128-wide block)."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.e4m3_reencode import T8_HI, T8_LO, e4m3_pair_asm
from dsv4.kernels.moe_layout import FP8_MAX_SCALE_SPREAD, FP8_MIN_BLOCK_SCALE, fp8_tiles

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


def _block_ok(b: torch.Tensor) -> bool:
    """The rule per row and 128-wide block: `fp8_tiles` with one-row tiles on scale bytes [N, K/32]."""
    return fp8_tiles(b[None], rows=1)[1]


def _blocks(spread: int, bmax: int, rows: int = 3) -> torch.Tensor:
    """[rows, 8] scale bytes: two 128-wide blocks, the first with exactly this spread and largest byte."""
    b = torch.full((rows, 8), bmax, dtype=torch.uint8)
    b[:, 1] = bmax - spread
    return b


@pytest.mark.parametrize("spread,bmax,ok", [(0, 127, True), (FP8_MAX_SCALE_SPREAD, 127, True),
                                            (FP8_MAX_SCALE_SPREAD + 1, 127, False),
                                            (0, FP8_MIN_BLOCK_SCALE, True), (0, FP8_MIN_BLOCK_SCALE - 1, False)])
def test_reencode_ok_admits_exactly_the_rule(spread, bmax, ok):
    assert _block_ok(_blocks(spread, bmax)) is ok


def test_reencode_ok_looks_at_every_block_separately():
    """Bytes 20 apart in different blocks are fine; within one block they are not."""
    b = torch.tensor([[120, 120, 120, 120, 100, 100, 100, 100]], dtype=torch.uint8)
    assert _block_ok(b)
    b[0, 3] = 100
    assert not _block_ok(b)


def _tiles_brute(b: torch.Tensor, rows: int):
    """`fp8_tiles` by loops over every tile: (largest byte per tile, whether each admits the rule)."""
    e, n, g = b.shape
    hi = torch.empty(e, n // rows, g // 4, dtype=torch.int32)
    ok = True
    for x in range(e):
        for r in range(n // rows):
            for k in range(g // 4):
                t = [int(v) for v in b[x, r * rows:(r + 1) * rows, 4 * k:4 * k + 4].flatten()]
                hi[x, r, k] = max(t)
                ok &= max(t) - min(t) <= FP8_MAX_SCALE_SPREAD and max(t) >= FP8_MIN_BLOCK_SCALE
    return hi, ok


@pytest.mark.parametrize("rows", [2, 4])
def test_fp8_tiles_against_loops(rows):
    """moe_glu_fp8's tiles (rows x 128-wide): each tile's largest byte and the rule over every tile, against
    loops; one byte moved past the spread in one tile (and only there) turns the answer to False."""
    gen = torch.Generator().manual_seed(rows)
    b = torch.randint(118, 127, (3, 4 * rows, 12), generator=gen).to(torch.uint8)
    hi, ok = fp8_tiles(b, rows)
    want_hi, want_ok = _tiles_brute(b, rows)
    assert torch.equal(hi, want_hi) and ok is want_ok is True
    b[1, rows, 4] = 126  # tile (1, 1, k = 1): its largest byte, and one 12 below it
    b[1, rows + 1, 6] = 126 - FP8_MAX_SCALE_SPREAD - 1
    hi, ok = fp8_tiles(b, rows)
    want_hi, want_ok = _tiles_brute(b, rows)
    assert torch.equal(hi, want_hi) and ok is want_ok is False


def test_fp8_tiles_spread_across_rows():
    """Rows that pass one by one (each uniform) fail as a tile when they are 12 apart."""
    b = torch.tensor([[[120] * 4], [[108] * 4]], dtype=torch.uint8).reshape(1, 2, 4)
    assert _block_ok(b[0])
    assert not fp8_tiles(b, 2)[1]
    assert fp8_tiles(b, 1)[1]


def _run_ptx(asm: str, operands: dict) -> dict:
    """Executes `asm` (and/or/shl/shr/mov/prmt on .b32, prmt in its default mode) on int64 tensors holding
    32-bit values; operands maps "$i" to a tensor; returns every register and operand after the last step."""
    regs = dict(operands)
    body = asm.strip().strip("{}").split(";")
    m32 = 0xFFFFFFFF

    def val(tok):
        tok = tok.strip()
        return regs[tok] if tok in regs else torch.tensor(int(tok, 0), dtype=torch.int64)

    for ins in (x.strip() for x in body):
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        dst, *src = (a.strip() for a in args.split(","))
        v = [val(a) for a in src]
        if op == "and.b32":
            r = v[0] & v[1]
        elif op == "or.b32":
            r = v[0] | v[1]
        elif op == "shl.b32":
            r = (v[0] << v[1]) & m32
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "mov.b32":
            r = v[0]
        elif op == "prmt.b32":  # default mode: selector nibble i (bits 2:0) picks byte i of {a, b}; bit 3: sign-fill
            src8 = [(v[0] >> (8 * k)) & 0xFF for k in range(4)] + [(v[1] >> (8 * k)) & 0xFF for k in range(4)]
            table = torch.stack(torch.broadcast_tensors(*src8, v[2])[:8], -1)
            r = torch.zeros_like(table[..., 0])
            for i in range(4):
                nib = (v[2] >> (4 * i)) & 0xF
                byte = torch.gather(table, -1, (nib & 7).expand(table.shape[:-1]).unsqueeze(-1)).squeeze(-1)
                byte = torch.where((nib & 8) != 0, torch.where(byte >= 0x80, 0xFF, 0), byte)
                r = r | (byte << (8 * i))
        else:
            raise AssertionError(f"interpreter: unknown instruction {op}")
        regs[dst] = r & m32
    return regs


def _tables(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One group's prmt table words for spreads d (the kernel's `_e2m1_e4m3`)."""
    return T8_LO - d * 0x08080800, T8_HI - d * 0x08080808


def test_pair_asm_is_exact_for_every_byte_lane_and_spread_pair():
    """All 256 byte values in each of the 4 lanes (the other lanes random), for all 12 x 12 spreads of the low-
    and high-nibble groups: output lane i of $0 is e4m3(e2m1(low nibble of byte i) * 2^(6 - d_lo)), of $1 the
    same for the high nibble with d_hi."""
    gen = torch.Generator().manual_seed(0)
    lanes = torch.randint(0, 256, (4, 4, 256), generator=gen)
    for i in range(4):
        lanes[i, i] = torch.arange(256)
    lanes = lanes.permute(0, 2, 1).reshape(-1, 4)  # [1024 words, 4 bytes]
    words = sum(lanes[:, k] << (8 * k) for k in range(4))
    d = torch.arange(FP8_MAX_SCALE_SPREAD + 1)
    d_lo, d_hi = d[:, None, None], d[None, :, None]
    (tla, tha), (tlb, thb) = _tables(d_lo), _tables(d_hi)
    regs = _run_ptx(e4m3_pair_asm(), {"$2": words[None, None, :], "$3": tla, "$7": tha, "$11": tlb, "$15": thb})
    e2m1 = torch.tensor(E2M1, dtype=torch.float64)
    for out, shift, dd in (("$0", 0, d_lo), ("$1", 4, d_hi)):
        got = torch.stack([(regs[out] >> (8 * k)) & 0xFF for k in range(4)], -1)
        got = got.to(torch.uint8).view(torch.float8_e4m3fn).double()
        code = (lanes >> shift) & 0xF
        want = e2m1[code & 7] * torch.exp2((6 - dd).double())[..., None] * torch.where(code >= 8, -1.0, 1.0)
        assert torch.equal(got, want), out
