"""The attention input's fused bf16 projections (`Attention.fused_input_weight`) and the side stream.

Session 46: `test_fused_prefill_reads_are_bit_identical` failed now and then because the stack was built on first
use, inside the projections' side-stream branch (`_project_fused`): the old weights, allocated on the main stream,
were freed at once, the main stream reused their memory for its next activations while the side stream's cat had
not yet read them, and the model kept a stack of activations for the rest of its life. Now the stack is built at
finalize, and a later rebuild (a replaced weight) keeps the old weights until the building stream has read them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dsv4
from dsv4 import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="streams and the caching allocator: CUDA only")


def _compressed_attentions(model):
    return [b.attn for b in model.layers if b.attn.compressor is not None]


def test_finalize_stacks_the_input_projections():
    """After load (finalize), every compressed layer's stack exists and the linears are its row views: no forward
    builds it."""
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
    attns = _compressed_attentions(model)
    assert attns
    for attn in attns:
        assert attn._fused is not None
        stacked, row = attn._fused[0], 0
        for lin in attn.fused_linears():
            assert lin.weight.data_ptr() == stacked[row].data_ptr()
            row += lin.out_features
        assert attn.fused_input_weight() is stacked


def test_rebuild_on_a_side_stream_reads_the_old_weights():
    """Replaced weights (fresh main-stream tensors), then the rebuild queued on a side stream behind a long sleep
    while the main stream at once allocates and fills tensors of the old weights' sizes: the stack still holds the
    old weights' values."""
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
    attn = _compressed_attentions(model)[0]
    gen = torch.Generator("cuda").manual_seed(46)
    for lin in attn.fused_linears():  # new tensors: the next use rebuilds the stack from them
        lin.weight.data = (torch.randn(lin.weight.shape, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
    want = torch.cat([lin.weight.detach().clone() for lin in attn.fused_linears()])
    shapes = [lin.weight.shape for lin in attn.fused_linears()]
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # (tens of ms: the cat runs after the main stream's fills below)
        stacked = attn.fused_input_weight()
    fills = [torch.full(s, float("nan"), dtype=torch.bfloat16, device="cuda") for s in shapes for _ in range(2)]
    torch.cuda.synchronize()
    assert torch.isnan(fills[0]).all()
    assert torch.equal(stacked, want)


def test_two_loads_give_the_same_logits():
    """Two loads of the embedded model in one process, prefills and multi-sequence decode steps over the paged
    pools (tests/paged_driver.py): the same logits bit for bit (before the fix the second load differed from the
    first now and then: the first forward built the stack on the side stream)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from paged_driver import PagedBatch

    runs = []
    for _ in range(2):
        model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
        runs.append(torch.cat(PagedBatch(model, "fp8").decode(6)))
        del model
    assert torch.isfinite(runs[0]).all() and runs[0].std() > 0
    assert torch.equal(runs[1], runs[0]), f"max |diff| {float((runs[1] - runs[0]).abs().max()):.3e}"
