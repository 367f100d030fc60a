"""Session 72: `indexer_fp8._fold_kernel`'s flag reads 0 on the GPU even for a zero row (s72a), while its bytes and
scales equal the reference's. This copy of its body stores each term of `ok` per row (int32 [R, 6]): the round-trip
equality, the exponent term, ok, ok as int32, the row's `good` and `good` after the atomic min."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from dsv4.kernels.indexer_fp8 import MIN_EXPONENT, fold_rows  # noqa: E402


@triton.jit
def _probe(X, OUT, OK, R, D: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    d = tl.arange(0, D)
    rm = r < R
    x = tl.load(X + r.to(tl.int64)[:, None] * D + d[None, :], mask=rm[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    exp = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    a = tl.where(amax > 0, exp - 7, 0)
    scaled = x * ((127 - a) << 23).to(tl.float32, bitcast=True)[:, None]
    x8 = scaled.to(tl.float8e4nv)
    eq = tl.min((x8.to(tl.float32) == scaled).to(tl.int32), axis=1)
    ex = ((amax == 0) | (exp >= MIN_EXPONENT)).to(tl.int32)
    ok = (eq != 0) & ((amax == 0) | (exp >= MIN_EXPONENT))
    good = tl.min(tl.where(rm, ok.to(tl.int32), 1), axis=0)
    tl.store(OUT + r * 8 + 0, eq, mask=rm)
    tl.store(OUT + r * 8 + 1, ex, mask=rm)
    tl.store(OUT + r * 8 + 2, ok.to(tl.int32), mask=rm)
    tl.store(OUT + r * 8 + 3, tl.where(ok, 1, 0), mask=rm)
    tl.store(OUT + r * 8 + 4, good + tl.zeros_like(r), mask=rm)
    tl.store(OUT + r * 8 + 5, exp, mask=rm)
    tl.store(OUT + r * 8 + 6, a, mask=rm)
    tl.store(OUT + r * 8 + 7, (amax == 0).to(tl.int32), mask=rm)
    tl.atomic_min(OK, good)


for name, row in (("zeros", torch.zeros(2, 128)), ("ones", torch.ones(2, 128)),
                  ("randn fp4-ish", torch.randint(-6, 7, (2, 128)).float() * 0.5)):
    x = row.to("cuda", torch.bfloat16)
    out = torch.full((2, 8), -7, dtype=torch.int32, device="cuda")
    ok = torch.ones(1, dtype=torch.int32, device="cuda")
    _probe[(1,)](x, out, ok, 2, D=128, BR=32, num_warps=4)
    ok2 = torch.ones(1, dtype=torch.int32, device="cuda")
    fold_rows(x, None, ok2)
    print(f"{name}: eq, exp term, ok, where(ok), good, exp, a, amax==0 per row {out.tolist()}; probe flag {ok.item()}, "
          f"fold_rows flag {ok2.item()}")
k = _probe.warmup(torch.empty(1, 128, dtype=torch.bfloat16, device="cuda"), torch.empty(8, dtype=torch.int32,
                  device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda"), 2, D=128, BR=32, num_warps=4,
                  grid=(1,))
ptx = k.asm["ptx"]
print("\n".join(line for line in ptx.splitlines() if "atom" in line or "cvt" in line and "e4m3" in line)[:1500])
