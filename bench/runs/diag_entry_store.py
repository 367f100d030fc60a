"""Session 50 diagnostic: attention.FUSED_ENTRY_STORE's model-level test differs on the GPU (kernel-level bytes
equal). Every compressor step launch of the tiny model's paged decode runs both ways on cloned pools: the fused
launch, then the separate launches from the same inputs; the first calls whose state rows / entry bytes differ are
printed with the differing (page, offset) rows and whether they are the trash page's."""
import sys
from pathlib import Path

import torch

import dsv4
from dsv4 import load_model
from dsv4.model import attention

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from paged_driver import PagedBatch  # noqa: E402

real = attention.Attention._compress_step_launch
seen = {"calls": 0, "bad": 0}


def _pool_bytes(pool):
    return [t.view(torch.uint8).clone() for t in (pool.q, pool.s, getattr(pool, "rope", None)) if t is not None]


def both(self, operands, rows):
    comp, (buf, page, slots, has_prev), row_slot, store = operands
    pool = store[2]
    buf0, pool0 = buf.clone(), _pool_bytes(pool)
    attention.FUSED_ENTRY_STORE = True
    real(self, operands, rows)
    torch.cuda.synchronize()
    buf_f, pool_f = buf.clone(), _pool_bytes(pool)
    buf.copy_(buf0)
    for t, b0 in zip((pool.q, pool.s, getattr(pool, "rope", None)), pool0):
        t.view(torch.uint8).copy_(b0)
    attention.FUSED_ENTRY_STORE = False
    real(self, operands, rows)
    torch.cuda.synchronize()
    seen["calls"] += 1
    diffs = [i for i, (a, b) in enumerate(zip(pool_f, _pool_bytes(pool))) if not torch.equal(a, b)]
    if diffs or not torch.equal(buf_f, buf):
        seen["bad"] += 1
        if seen["bad"] <= 6:
            e_page, e_off = store[0].tolist(), store[1].tolist()
            where = []
            for i in diffs:
                a, b = pool_f[i], _pool_bytes(pool)[i]
                rows_bad = (a != b).flatten(2).any(-1).nonzero().tolist()
                where.append((("q", "s", "rope")[i], rows_bad[:8]))
            print(f"call {seen['calls']} layer {self.layer_index} {comp.kind} ratio {comp.ratio} B={len(e_page)}: "
                  f"state rows equal {torch.equal(buf_f, buf)}; entry (page, off) {list(zip(e_page, e_off))[:8]}; "
                  f"differing pool [page, off] {where}")


attention.Attention._compress_step_launch = both
model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
batch = PagedBatch(model, "fp8")
batch.decode(12)
print(f"{seen['calls']} compressor step launches, {seen['bad']} differ")
