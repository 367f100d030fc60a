"""Under MTP speculation, the MTP state a request takes over (a fork of a prefix snapshot, a retained turn forked or
moved) holds the rows a fresh computation of its prompt would.

The MTP block's row of position i is fed token i + 1 (`mtp_catch_up`), so the last row of a source holding n tokens
depends on its token n. Where the adopter's prompt goes on with another token there, it must take n - 1 tokens and
compute that row again (`PromptSharing._fork_point`, `RetainedSequences.adopt`); where it goes on with the same
token, all n. Reference: the same prompt through an engine without snapshots or retention. CPU, tiny fp32 model;
the stale row would differ by the embedding of another token, far above the chunking's float noise.
"""
from __future__ import annotations

import pytest
import torch

from _spec_decode_helpers import MAX_LEN, assert_all_free, build_model, drain, step
from dsv4.checkpoint.writer import random_master_weights, tiny_config
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.prefix_snapshots import SNAPSHOT_BLOCK
from dsv4.engine.sampling_params import SamplingParams

CFG = tiny_config("fp4", layers="sliding,csa,hca", vocab_size=32)


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, random_master_weights(CFG, seed=71))


def _engine(model, **kw) -> LLMEngine:
    return LLMEngine(model, model.config, None,
                     EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN,
                                  speculative="mtp", num_draft_tokens=2, **kw))


def _mtp_prompt_rows(engine: LLMEngine, rid: str, prompt: list[int]) -> tuple[dict[int, torch.Tensor], list[int]]:
    """Run `prompt` to its end: the MTP rows of its prompt positions still in the window once its first token is out
    (position -> row), and the tokens it generated."""
    engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    out: dict = {}
    while not out.get(rid, {}).get("tokens"):
        step(engine, out)
    rows, positions = engine.cache.states[rid].mtp.window()
    got = {int(p): r.clone() for p, r in zip(positions, rows) if p < len(prompt) - 1}
    drain(engine, out)
    return got, out[rid]["tokens"]


def _assert_rows_equal(got: dict, want: dict, must_cover: int) -> None:
    assert must_cover in got and set(got) == set(want)
    for p in got:
        torch.testing.assert_close(got[p], want[p], rtol=1e-4, atol=1e-4, msg=lambda m: f"MTP row {p}: {m}")


def _fresh(model, prompt) -> dict:
    return _mtp_prompt_rows(_engine(model), "fresh", prompt)[0]


@pytest.mark.parametrize("same_next", [False, True])
def test_a_snapshot_fork_holds_fresh_mtp_rows(model, same_next):
    """q1 takes the snapshot of the 64 shared tokens (its MTP row 63 fed q1's token 64); q2 forks it. Going on with
    another token q2 takes 63 tokens, with the same one all 64."""
    g = torch.Generator().manual_seed(72)
    system = torch.randint(2, CFG.vocab_size, (SNAPSHOT_BLOCK,), generator=g).tolist()
    q1_next = 5
    asks = [system + [4, 9, 11], system + [q1_next, 7, 3], system + [q1_next if same_next else 6, 12, 8]]
    engine = _engine(model, prefix_snapshots=2)
    rows = [_mtp_prompt_rows(engine, f"q{j}", ask)[0] for j, ask in enumerate(asks)]
    s = engine.stats()
    assert (s.snapshots_taken, s.num_forks) == (1, 1)
    assert s.shared_prompt_tokens == SNAPSHOT_BLOCK - (0 if same_next else 1)
    _assert_rows_equal(rows[2], _fresh(model, asks[2]), must_cover=SNAPSHOT_BLOCK - 1)
    engine.snapshots.clear()
    assert_all_free(engine)


@pytest.mark.parametrize("share", [True, False])
def test_a_retained_turn_whose_next_token_changed_holds_fresh_mtp_rows(model, share):
    """The next turn's prompt keeps the retained tokens but not the one after them (a re-rendered turn end): the
    adopter -- a fork of the entry, or the entry itself without prompt sharing -- takes one token less."""
    g = torch.Generator().manual_seed(73)
    first = torch.randint(2, CFG.vocab_size, (40,), generator=g).tolist()
    engine = _engine(model, retain_finished=2, share_prompts=share)
    _, reply = _mtp_prompt_rows(engine, "t0", first)
    (key,) = engine.retained.eviction_order()
    after = (first + reply)[len(key)]  # the token t0's MTP state's last row was fed
    nxt = list(key) + [(after + 1) % CFG.vocab_size or 2, 13, 14, 15]
    got, _ = _mtp_prompt_rows(engine, "t1", nxt)
    s = engine.stats()
    assert (s.num_adopted, s.adopted_tokens) == (1, len(key) - 1)
    _assert_rows_equal(got, _fresh(model, nxt), must_cover=len(key) - 1)
    engine.retained.clear()
    assert_all_free(engine)
