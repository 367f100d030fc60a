"""MTP speculative decoding (dsv4.engine.spec_decode) on tiny fp32 models, CPU: sampling.

References, independent of the speculative path:
* the acceptance rule alone: Monte Carlo against the known target distributions;
* end to end: the exact distribution of the first generated tokens, re-derived in float64 from plain
  forwards of the model over every prefix (temperature and top-k applied here, not by dsv4), and a
  chi-square goodness-of-fit test of many seeded speculative generations against it.
"""
from __future__ import annotations

import math

import pytest
import torch

from _spec_decode_helpers import PROMPT, SMALL, assert_all_free, build_model, drain, make_engine
from dsv4.checkpoint.writer import random_master_weights
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine import spec_decode
from dsv4.engine.spec_decode import rejection_sample
from dsv4.engine.spec_sampling import verdict


# ---- the acceptance rule ---------------------------------------------------------------------

def chi2_sf(x: float, df: int) -> float:
    """P(chi2_df >= x): the regularised upper incomplete gamma Q(df/2, x/2) by its power series."""
    a, z = df / 2, x / 2
    term = total = 1.0 / a
    n = 1
    while term > 1e-15 * total:
        term *= z / (a + n)
        total += term
        n += 1
    return 1.0 - math.exp(a * math.log(z) - z - math.lgamma(a)) * total if z > 0 else 1.0


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson goodness of fit; cells expecting < 5 are pooled."""
    n = float(counts.sum())
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat((counts.double()[~small], counts.double()[small].sum().reshape(1)))
    exp = torch.cat((expected[~small], expected[small].sum().reshape(1)))
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return chi2_sf(stat, int(keep.sum()) - 1)


def two_draft_laws(g: torch.Generator, v: int = 5) -> tuple[torch.Tensor, ...]:
    """(p0, q0, p1, q1, p2): target and draft laws of two drafts; q far from p, with zeros on both sides."""
    p0 = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q0 = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    p1 = torch.softmax(torch.randn(v, v, generator=g) * 1.5, -1)
    q1 = torch.softmax(torch.randn(v, v, generator=g) * 1.5, -1)
    return p0, q0, p1, q1, torch.softmax(torch.randn(v, v, v, generator=g), -1)


def test_rejection_sample_preserves_target_distribution():
    """Drafts d1 ~ q0, d2 ~ Q1[d1]: the first emitted token must follow p0, and the second, given an
    accepted first draft v, P1[v] -- whatever q is (here far from p, with zeros on both sides)."""
    v = 5
    g = torch.Generator().manual_seed(5)
    p0, q0, p1, q1, p2 = two_draft_laws(g, v)
    first, second = torch.zeros(v), torch.zeros(v, v)
    n = 4000
    for _ in range(n):
        d1 = int(torch.multinomial(q0, 1, generator=g))
        d2 = int(torch.multinomial(q1[d1], 1, generator=g))
        out = rejection_sample(torch.stack((p0, p1[d1], p2[d1, d2])), torch.stack((q0, q1[d1])), [d1, d2], g)
        assert 1 <= len(out) <= 3 and out[:-1] == [d1, d2][: len(out) - 1]
        first[out[0]] += 1
        if len(out) >= 2:
            second[out[0], out[1]] += 1
    assert first[4] == 0  # p0 excludes token 4, although q0 proposes it most
    assert chi2_pvalue(first, p0) > 1e-3
    for t in range(4):
        if second[t].sum() > 200:
            assert chi2_pvalue(second[t], p1[t]) > 1e-3


def test_device_verdict_preserves_target_distribution():
    """The device path's rule (`spec_sampling.verdict`: every position's test and candidate drawn up front, the
    row cut at its first rejection) on 4000 rows at once, with the host test's p and q: the same two laws."""
    from types import SimpleNamespace
    v, n = 5, 4000
    g = torch.Generator().manual_seed(6)
    p0, q0, p1, q1, p2 = two_draft_laws(g, v)
    d1 = torch.multinomial(q0, n, replacement=True, generator=g)
    d2 = torch.multinomial(q1[d1], 1, generator=g)[:, 0]
    p = torch.stack((p0.expand(n, v), p1[d1], p2[d1, d2]), 1).reshape(3 * n, v)  # rows of 3 positions
    q = torch.stack((q0.expand(n, v), q1[d1], torch.zeros(n, v)), 1).reshape(3 * n, v)
    drafts = torch.stack((d1, d2, torch.zeros_like(d1)), 1).reshape(-1)
    seqs = [SimpleNamespace(params=SamplingParams(temperature=1.0))] * n
    accept, candidate = verdict(p.log(), seqs, [3] * n, drafts, q, [None] * n, g)
    accept, candidate = accept.view(n, 3), candidate.view(n, 3)
    assert not accept[:, 2].any()
    kept = torch.where(~accept[:, 0], 0, torch.where(~accept[:, 1], 1, 2))
    first = torch.where(kept == 0, candidate[:, 0], d1)
    second = torch.where(kept == 1, candidate[:, 1], torch.where(kept == 2, d2, -1))
    assert (first != 4).all()  # p0 excludes token 4, although q0 proposes it most
    assert chi2_pvalue(torch.bincount(first, minlength=v).float(), p0) > 1e-3
    for t in range(4):
        got = second[(first == t) & (kept >= 1)]
        if got.numel() > 200:
            assert chi2_pvalue(torch.bincount(got, minlength=v).float(), p1[t]) > 1e-3


def test_device_verdict_of_greedy_drafts_beside_sampled_rows_without():
    """A greedy row with drafts beside sampled rows with none (no q at all): the greedy row keeps its drafts up to
    the first that differs from the argmax and then emits the argmax; each sampled row emits a draw from its p."""
    from types import SimpleNamespace
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(2 + 400, 7, generator=g)
    targets = logits[:2].argmax(-1)
    drafts = torch.zeros(402, dtype=torch.long)
    drafts[0] = targets[0]  # accepted; position 1 is the bonus
    seqs = [SimpleNamespace(params=SamplingParams(temperature=0.0))] + \
        [SimpleNamespace(params=SamplingParams(temperature=1.0))] * 400
    accept, candidate = verdict(logits, seqs, [2] + [1] * 400, drafts, None, [None] * 401, g)
    assert accept.tolist() == [True] + [False] * 401
    assert candidate[:2].tolist() == targets.tolist()
    assert (candidate[2:] != candidate[2]).any()  # drawn, not the argmax everywhere


# ---- sampling distribution end to end --------------------------------------------------------

TOP_K, TEMP = 3, 1.3


def exact_processed(model, prefix: list[int]) -> torch.Tensor:
    """Target distribution after `prefix` in float64: temperature, then the top-k mask."""
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(prefix), torch.arange(len(prefix))))[-1].double()
    logits = logits / TEMP
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[torch.sort(logits, descending=True, stable=True).indices[:TOP_K]] = True
    return torch.softmax(logits.masked_fill(~keep, float("-inf")), -1)


@pytest.fixture(scope="module")
def small_model():
    return build_model(SMALL, random_master_weights(SMALL, seed=71))


@pytest.mark.parametrize("on_device", [False, True])
def test_sampling_matches_target_distribution(small_model, on_device, monkeypatch):
    """Joint law of the first three generated tokens under k=2 (the second and third come from draft
    acceptance, the correction or the bonus token) against the exact law; the draws on the host, or on the
    device (`SAMPLED_ON_DEVICE`, every step's verdict read back once)."""
    monkeypatch.setattr(spec_decode, "SAMPLED_ON_DEVICE", on_device)
    v = SMALL.vocab_size
    p1 = exact_processed(small_model, PROMPT)
    joint = torch.zeros(v, v, v, dtype=torch.float64)
    for a in p1.nonzero()[:, 0].tolist():
        p2 = exact_processed(small_model, PROMPT + [a])
        for b in p2.nonzero()[:, 0].tolist():
            joint[a, b] = p1[a] * p2[b] * exact_processed(small_model, PROMPT + [a, b])
    counts = torch.zeros(v, v, v)
    engine = make_engine(small_model, 2, max_num_seqs=128, budget=512, max_len=32)
    judged, judge = [0], engine.speculator._judge_on_device

    def counting(*a):
        judged[0] += 1
        return judge(*a)

    engine.speculator._judge_on_device = counting
    n = 512
    for s in range(n):
        engine.add_request(f"s{s}", PROMPT, SamplingParams(temperature=TEMP, top_k=TOP_K, seed=1000 + s,
                                                           max_tokens=4, ignore_eos=True))
    out = drain(engine)
    for r in out.values():
        a, b, c = r["tokens"][:3]
        counts[a, b, c] += 1
    hist = engine.speculator.stats.accepted_histogram
    assert len(hist) == 3 and min(hist) > 0
    assert (judged[0] > 0) == on_device
    assert chi2_pvalue(counts.flatten(), joint.flatten()) > 1e-3
    assert_all_free(engine)


@pytest.mark.parametrize("on_device", [False, True])
def test_seeded_sampling_reproducible_across_batches(small_model, on_device, monkeypatch):
    monkeypatch.setattr(spec_decode, "SAMPLED_ON_DEVICE", on_device)
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=s, max_tokens=12, ignore_eos=True) for s in (1, 2)]
    alone = []
    for p in params:
        engine = make_engine(small_model, 3, max_len=32)
        engine.add_request("x", PROMPT, p)
        alone.append(drain(engine)["x"]["tokens"])
    engine = make_engine(small_model, 3, max_len=32)
    engine.add_request("noise", [1, 2, 3, 4, 5], SamplingParams(temperature=1.0, max_tokens=9))
    for i, p in enumerate(params):
        engine.add_request(f"x{i}", PROMPT, p)
    out = drain(engine)
    assert [out["x0"]["tokens"], out["x1"]["tokens"]] == alone
    assert alone[0] != alone[1]
