"""Mixed steps (decode rows beside prompt chunks) as two forwards on the GPU (dsv4.model.mixed_steps): the engine
on its GPU defaults (graphs, FP8 cache, prefill pieces), prompts admitted while others decode, gives the same greedy
text with the split as without, up to a near tie (the decode rows then run the fixed-shape step's kernels instead
of the per-sequence attention); so does the split in one pass (ONE_PASS_MIXED_STEPS)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dsv4.model import mixed_steps

DEVICE = "cuda"


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("speculative", [None, "mtp"])
def test_split_mixed_steps_keep_the_greedy_text(monkeypatch, speculative, one_pass):
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
    from _split_spies import count_splits
    from test_engine_gpu import assert_same_greedy_text

    from dsv4 import LLM, SamplingParams

    gen = torch.Generator().manual_seed(62)
    prompts = [torch.randint(2, 2048, (n,), generator=gen).tolist() for n in (7, 150, 40, 300, 12, 90)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    split, mtp_split = count_splits(monkeypatch)
    monkeypatch.setattr(mixed_steps, "ONE_PASS_MIXED_STEPS", one_pass)
    for on in (False, True):
        monkeypatch.setattr(mixed_steps, "SPLIT_MIXED_STEPS", on)
        llm = LLM(device=DEVICE, max_num_seqs=4, max_num_batched_tokens=64, speculative=speculative)
        runs[on] = llm.generate(prompts, params)
    assert sum(split) >= 3, split  # the 150- and 300-token prompts came in chunks beside decode rows
    assert bool(sum(mtp_split)) == (speculative is not None)  # (the MTP block's catch-up over those rows)
    for a, b in zip(runs[False], runs[True]):
        assert_same_greedy_text(b, a)
