"""Session 72: `indexer_fp8.fold_rows`'s flag under each formulation (FOLD_BY_BITS, FOLD_PER_ROW) against the
reference's, on rows that fold (zeros, ones, FP4-simulated) and rows that do not (blocks 2^20 apart, a subnormal
largest value). Prints one line per formulation and `PICK by_bits per_row` for the first that agrees everywhere.
Runs on the GPU or, with TRITON_INTERPRET=1 and DEV=cpu, through the interpreter."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from dsv4.kernels import indexer_fp8  # noqa: E402
from dsv4.model.numerics import simulate_indexer_fp4  # noqa: E402

DEV = os.environ.get("DEV", "cuda")
gen = torch.Generator(DEV).manual_seed(5)


def fp4_rows(*shape):
    x = torch.randn(*shape, 128, generator=gen, device=DEV)
    return simulate_indexer_fp4(x * torch.exp2(torch.randint(-4, 5, (*shape, 1), generator=gen, device=DEV)))


spread = fp4_rows(40)
spread[7, 32:] *= 2.0 ** -20
inputs = {"zeros": torch.zeros(3, 128), "ones": torch.ones(3, 128), "fp4 q": fp4_rows(37, 8), "fp4 keys": fp4_rows(45),
          "spread (bad)": spread, "tiny (bad)": torch.full((2, 128), 2.0 ** -110)}
pick = None
for by_bits in (False, True):
    for per_row in (False, True):
        indexer_fp8.FOLD_BY_BITS, indexer_fp8.FOLD_PER_ROW = by_bits, per_row
        seen = []
        for name, x in inputs.items():
            x = x.to(DEV, torch.bfloat16)
            w = None if x.dim() != 3 else (torch.randn(x.shape[:-1], generator=gen, device=DEV) * 0.01).to(
                torch.bfloat16)
            ok = torch.ones(1, dtype=torch.int32, device=DEV)
            x8, s = indexer_fp8.fold_rows(x, w, ok)
            r8, rs, rok = indexer_fp8.fold_rows_ref(x.reshape(-1, 128), None if w is None else w.reshape(-1))
            same = torch.equal(x8.reshape(-1, 128).view(torch.uint8), r8.view(torch.uint8)) and torch.equal(
                s.reshape(-1), rs)
            seen.append((name, ok.item(), int(rok), same))
        agree = all(k == r and same for _, k, r, same in seen)
        print(f"by_bits {by_bits} per_row {per_row}: " + ", ".join(f"{n} {k}/{r}{'' if same else ' (bytes differ)'}"
                                                                 for n, k, r, same in seen) + f" -> {agree}")
        if agree and pick is None:
            pick = (by_bits, per_row)
print("PICK", *pick if pick else ("none", "none"))
