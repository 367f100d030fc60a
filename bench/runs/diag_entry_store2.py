"""Session 50 diagnostic (2): the tiny model's paged decode logits with attention.FUSED_ENTRY_STORE off / on, in one
process, plain and with every entry pool's trash page zeroed after each compressor step launch (argv: plain, zero).
Equal logits with the trash zeroed: something reads the trash page's content (which the fused launch's racing
last arrivers leave different from the separate store's)."""
import sys
from pathlib import Path

import torch

import dsv4
from dsv4 import load_model
from dsv4.model import attention

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from paged_driver import PagedBatch  # noqa: E402

real = attention.Attention._compress_step_launch


def zeroing(self, operands, rows):
    real(self, operands, rows)
    pool = operands[3][2]
    for t in (pool.q, pool.s, getattr(pool, "rope", None)):
        if t is not None:
            t[-1].zero_()  # the trash page: the last (dsv4.engine.paged_state.PagedPools.trash)


for mode in sys.argv[1:]:
    attention.Attention._compress_step_launch = zeroing if mode == "zero" else real
    out = {}
    for fused in (False, True, False, True):
        attention.FUSED_ENTRY_STORE = fused
        model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
        steps = PagedBatch(model, "fp8").decode(12)
        logits = torch.cat(steps)
        ref = out.setdefault(fused, logits)
        base = out[False]
        first = next((i for i, (a, b) in enumerate(zip(steps, torch.split(base, [s.shape[0] for s in steps])))
                      if not torch.equal(a, b)), None)
        print(f"{mode} fused={fused}: vs first same {float((logits - ref).abs().max()):.3e}, vs first off "
              f"{float((logits - base).abs().max()):.3e} (first differing step {first})")
