"""Diagnostic (session 46): test_fused_prefill_reads_are_bit_identical failed once with moe.ROUTER_QUANTISES_X on.
Logits of tests/paged_driver.PagedBatch (12 decode steps) for ROUTER_QUANTISES_X x FUSED_PREFILL_READS, each run
twice: the max |diff| of every run against the first (run-to-run repeats show a race, pairs show a dependence)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))


def main() -> None:
    import dsv4
    from dsv4 import load_model
    from dsv4.model import attention, moe
    from paged_driver import PagedBatch
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    runs = {}
    for router in (False, True):
        for fused in (False, True):
            for rep in (0, 1):
                moe.ROUTER_QUANTISES_X = router
                attention.FUSED_PREFILL_READS = attention.PREFILL_HCA_CAUSAL = fused
                model = load_model(path, torch.device("cuda"), torch.bfloat16, kernels="triton")
                runs[(router, fused, rep)] = torch.cat(PagedBatch(model, "fp8").decode(12))
                del model
    base = runs[(False, False, 0)]
    for key, r in runs.items():
        d = float((r.double() - base.double()).abs().max())
        print(f"router_quant={key[0]!s:5} fused_reads={key[1]!s:5} rep={key[2]}: max |diff| vs first {d:.3e}",
              flush=True)


if __name__ == "__main__":
    main()
