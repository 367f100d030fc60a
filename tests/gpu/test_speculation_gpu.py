"""MTP speculative decoding on a GPU (the embedded model, the FP8 cache, CUDA graphs): graphed against eager steps and
device against host picks for greedy drafts (dsv4.engine.spec_decode, mtp_catch_up), and sampled rows on the device
path (dsv4.engine.spec_sampling). The rules and laws themselves are checked on the CPU (tests/test_spec_decode*.py)."""
from __future__ import annotations

DEVICE = "cuda"  # tests/gpu/conftest.py skips this file without CUDA


def test_speculative_decoding_on_the_gpu_graphed_matches_eager(eager_prefill):
    """MTP speculation (2 drafts) over the paged FP8 cache: its draft and verify steps as CUDA graphs give the
    eager run's tokens, the drafts are used, and greedy speculation stays close to plain greedy decoding
    (verify steps of 3 rows round differently from 1-row steps in bf16, so the texts may part late). Greedy drafts
    picked on the device (one read-back per step) are the drafts the host path picks: same accepted lengths, with
    the MTP catch-up after the verdict on both paths (the early catch-up runs the MTP over all 3 rows of a verify
    step, which rounds differently in bf16 from the kept rows alone: its drafts may differ at a near-tie)."""
    from dsv4 import LLM, SamplingParams
    from dsv4.engine import spec_decode

    prompts = ["def main():", "The", "import os\nimport sys\n", "class A:\n    def"]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    runs, accepted = {}, {}
    try:
        for graphs, on_device, early in ((False, True, True), (True, True, True), (True, True, False),
                                         (True, False, False)):
            spec_decode.EARLY_CATCH_UP = early
            llm = LLM(device=DEVICE, kv_dtype="fp8", cuda_graphs=graphs, speculative="mtp", num_draft_tokens=2)
            llm.engine.speculator.on_device = on_device
            runs[graphs, on_device, early] = [r.token_ids for r in llm.generate(prompts, params)]
            stats = llm.engine.speculator.stats
            accepted[graphs, on_device, early] = stats.accepted_histogram
            assert stats.num_draft_tokens > 0 and stats.acceptance_rate > 0.15, stats  # CPU: 0.36
    finally:
        spec_decode.EARLY_CATCH_UP = True
    assert runs[True, True, True] == runs[False, True, True]
    assert runs[True, True, False] == runs[True, False, False]
    assert accepted[True, True, False] == accepted[True, False, False]
    plain = [r.token_ids for r in LLM(device=DEVICE, kv_dtype="fp8").generate(prompts, params)]
    assert sum(a[:8] == b[:8] for a, b in zip(runs[True, True, True], plain)) >= 3


def test_sampled_speculation_on_the_device(monkeypatch):
    """`spec_decode.SAMPLED_ON_DEVICE` on a GPU (session 67; the law itself is checked on the CPU,
    tests/test_spec_decode_sampling.py): seeded sampled requests with 2 MTP drafts under CUDA graphs and the FP8
    cache take the device path (one read-back per verify), are reproducible run to run and accept drafts. (Alone
    against in a batch is checked on the CPU only: on a GPU the batch's row count changes the bf16 rounding of the
    logits, which may flip a draw at a near-tie.)"""
    from dsv4 import LLM, SamplingParams
    from dsv4.engine import spec_decode

    monkeypatch.setattr(spec_decode, "SAMPLED_ON_DEVICE", True)
    prompts = ["def main():", "The", "import os\nimport sys\n", "class A:\n    def"]
    params = [SamplingParams(temperature=0.8, top_k=20, seed=7 + i, max_tokens=32, ignore_eos=True)
              for i in range(len(prompts))]
    kw = dict(device=DEVICE, kv_dtype="fp8", cuda_graphs=True, speculative="mtp", num_draft_tokens=2)
    runs = []
    for _ in range(2):
        llm = LLM(**kw)
        judged, judge = [0], llm.engine.speculator._judge_on_device

        def counting(*a, judge=judge, judged=judged):
            judged[0] += 1
            return judge(*a)

        llm.engine.speculator._judge_on_device = counting
        runs.append([r.token_ids for r in llm.generate(prompts, params)])
        stats = llm.engine.speculator.stats
        assert judged[0] > 0 and stats.num_draft_tokens > 0 and stats.acceptance_rate > 0.1, stats
    assert runs[0] == runs[1]
    assert all(len(r) == 32 for r in runs[0]) and len({tuple(r) for r in runs[0]}) == len(prompts)
