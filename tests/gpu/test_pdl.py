"""Programmatic dependent launch (`dsv4.kernels._triton.pdl_kernel`): with it each decode kernel may be
scheduled while the previous one still runs and starts its weights' L2 prefetch before its wait. Any read
of an input before the wait would be a race; the logits of paged FP8 prefills and decode steps, eager and
under whole-step CUDA graphs, must equal bit for bit those of a process where every kernel launches
serially (DSV4_PDL=0)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]


def _logits(graphs: bool) -> torch.Tensor:
    sys.path.insert(0, str(ROOT / "tests"))
    from paged_driver import PagedBatch

    import dsv4
    from dsv4 import load_model
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
    if graphs:
        model.enable_cuda_graphs(max_batch=8)
    return torch.cat(PagedBatch(model, "fp8").decode(16))


def main(out: str) -> None:  # the serial side, in its own process (PDL is fixed when the kernels compile)
    save_file({f"g{int(g)}": _logits(g).contiguous() for g in (False, True)}, out)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    from dsv4.kernels import _triton
    if not _triton.PDL:
        pytest.skip("PDL is off in this process (DSV4_PDL=0 or no Triton)")
    out = tmp_path_factory.mktemp("pdl") / "serial.safetensors"
    subprocess.run([sys.executable, __file__, str(out)], check=True, env=dict(os.environ, DSV4_PDL="0"), cwd=ROOT)
    return load_file(str(out))


@pytest.mark.parametrize("graphs", [False, True])
def test_pdl_launches_match_serial_launches(serial, graphs):
    got = _logits(graphs)
    ref = serial[f"g{int(graphs)}"]
    assert torch.isfinite(got).all() and got.std() > 0
    assert torch.equal(got, ref), float((got - ref).abs().max())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1])
