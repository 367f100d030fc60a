"""Session 71: why `indexer_fp8.fold_rows` clears its flag on the GPU for rows its reference folds (s71d): per input,
the flag, the reference's, and the first rows whose bytes / scales differ."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from dsv4.kernels.indexer_fp8 import fold_rows, fold_rows_ref  # noqa: E402
from dsv4.model.numerics import simulate_indexer_fp4  # noqa: E402

gen = torch.Generator("cuda").manual_seed(3)
for shape, with_w in (((37, 8), True), ((37, 8), False), ((45,), False), ((64,), False), ((1, 1), False)):
    x = torch.randn(*shape, 128, generator=gen, device="cuda")
    x = simulate_indexer_fp4(x * torch.exp2(torch.randint(-4, 5, (*shape, 1), generator=gen, device="cuda")))
    x = x.to(torch.bfloat16)
    w = torch.randn(*shape, device="cuda").to(torch.bfloat16) * 0.01 if with_w and len(shape) == 2 else None
    ok = torch.ones(1, dtype=torch.int32, device="cuda")
    x8, s = fold_rows(x, w, ok)
    r8, rs, rok = fold_rows_ref(x.reshape(-1, 128), None if w is None else w.reshape(-1))
    byte_rows = (x8.reshape(-1, 128).view(torch.uint8) != r8.view(torch.uint8)).any(1).nonzero().flatten()
    s_rows = (s.reshape(-1) != rs).nonzero().flatten()
    print(f"shape {shape} w {w is not None}: kernel ok {ok.item()} ref ok {rok}; rows with other bytes "
          f"{byte_rows[:6].tolist()} ({len(byte_rows)}), other scales {s_rows[:6].tolist()} ({len(s_rows)})")
    if len(byte_rows):
        r = byte_rows[0]
        print("   x", x.reshape(-1, 128)[r, :8].tolist(), "\n   k", x8.reshape(-1, 128)[r, :8].float().tolist(),
              "\n   r", r8[r, :8].float().tolist())
    if len(s_rows):
        r = s_rows[0]
        print("   s", s.reshape(-1)[r].item(), rs[r].item(), "amax", x.reshape(-1, 128)[r].float().abs().max().item())
# rows that fold trivially: if these clear the flag too, the flag's store is at fault, not the rows' checks
for name, row in (("zeros", torch.zeros(1, 128)), ("ones", torch.ones(1, 128)), ("halves", torch.full((1, 128), 0.5)),
                  ("ramp", torch.tensor([[(i % 8) * 0.5 for i in range(128)]]))):
    ok = torch.ones(1, dtype=torch.int32, device="cuda")
    fold_rows(row.to("cuda", torch.bfloat16), None, ok)
    print(f"{name}: kernel ok {ok.item()} ref ok {fold_rows_ref(row.to(torch.bfloat16))[2]}")
