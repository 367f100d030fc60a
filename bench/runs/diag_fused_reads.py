"""Session 49 diagnostic: test_fused_prefill_reads_are_bit_identical fails when run alone (passes in its file's
sequence). Decode logits of the tiny model for a sequence of (FUSED_PREFILL_READS, PREFILL_HCA_CAUSAL) settings in
one process, each compared with the first run of the same setting and with the first run overall."""
import sys
from pathlib import Path

import torch

import dsv4
from dsv4 import load_model
from dsv4.model import attention

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from paged_driver import PagedBatch  # noqa: E402

path = Path(dsv4.__file__).parent / "assets" / "tiny"
first = {}
for label in sys.argv[1:]:
    reads, causal = (c == "T" for c in label)
    attention.FUSED_PREFILL_READS, attention.PREFILL_HCA_CAUSAL = reads, causal
    model = load_model(path, "cuda", torch.bfloat16, kernels="triton")
    batch = PagedBatch(model, "fp8")
    steps = batch.decode(12)
    out = torch.cat(steps)
    ref = first.setdefault(label, out)
    base = first.setdefault("all", out)
    per_step = [float((a.double() - b.double()).abs().max()) for a, b in
                zip(steps, torch.split(base, [s.shape[0] for s in steps]))]
    first_bad = next((i for i, d in enumerate(per_step) if d), None)
    print(f"{label}: vs first {label} {float((out.double() - ref.double()).abs().max()):.3e}, vs first run "
          f"{float((out.double() - base.double()).abs().max()):.3e} (first differing step {first_bad})")
