"""Session 50 diagnostic: the tiny model's paged decode (tests/paged_driver.py, 12 steps with multi-token steps and
rollbacks) is not always bit-identical between runs in one process on the GPU; the first differing output is the
rollback's 2-token chunk or the MTP-like step after it. Runs per setting (argv: LABEL=RUNS; labels below) under
GPU contention (a second process multiplying matrices), each compared with the setting's first run and the
first run overall."""
import subprocess
import sys
from pathlib import Path

import torch

import dsv4
from dsv4 import load_model
from dsv4.model import attention, side_stream

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from paged_driver import PagedBatch  # noqa: E402

NEW = ("FUSED_KV_STORE", "DECODE_Q_NORM_IN_KERNEL", "COMPRESS_BESIDE")
SETTINGS = {  # label: (the session-50 decode folds on, side_stream.OVERLAP)
    "old": (False, ("shared_expert", "projections")), "old-noside": (False, ()),
    "old-shared": (False, ("shared_expert",)), "old-proj": (False, ("projections",)),
    "new": (True, ("shared_expert", "projections")), "new-noside": (True, ()),
}
hog = subprocess.Popen([sys.executable, "-c", "import torch\na = torch.randn(4096, 4096, device='cuda')\n"
                        "while True: a = (a @ a).clamp(-1, 1)"])
path = Path(dsv4.__file__).parent / "assets" / "tiny"
first = {}
try:
    for arg in sys.argv[1:]:
        label, runs = arg.split("=")
        folds, side_stream.OVERLAP = SETTINGS[label]
        for name in NEW:
            setattr(attention, name, folds)
        for _ in range(int(runs)):
            model = load_model(path, "cuda", torch.bfloat16, kernels="triton")
            steps = PagedBatch(model, "fp8").decode(12)
            out = torch.cat(steps)
            ref, base = first.setdefault(label, out), first.setdefault("all", out)
            bad = [i for i, (a, b) in enumerate(zip(steps, torch.split(ref, [s.shape[0] for s in steps])))
                   if not torch.equal(a, b)]
            print(f"{label}: vs its first {float((out - ref).abs().max()):.3e} (differing outputs {bad[:4]}), "
                  f"vs the first run {float((out - base).abs().max()):.3e}", flush=True)
finally:
    hog.kill()
