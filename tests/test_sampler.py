import math
import random

import pytest
import torch

from dsv4.engine.sampler import Sampler, apply_logit_bias, apply_penalties, filter_logits, make_generator
from dsv4.engine.sampling_params import SamplingParams


# ---- float64 re-derivations -------------------------------------------------------------------

def ref_penalties(logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    out = []
    for tok, x in enumerate(logits):
        if tok in prompt or tok in output:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        count = output.count(tok)
        x -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
        out.append(x)
    return out


def ref_keep(logits: list[float], p: SamplingParams) -> tuple[list[bool], float]:
    """Kept-token mask of temperature + min-p + top-k + top-p, and the smallest decision margin."""
    z = [x / p.temperature for x in logits]
    m = max(z)
    e = [math.exp(v - m) for v in z]
    probs = [v / sum(e) for v in e]
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))
    keep = [True] * len(z)
    margin = math.inf
    if p.min_p > 0:
        thr = p.min_p * max(probs)
        for i in range(len(z)):
            keep[i] = probs[i] >= thr
            margin = min(margin, abs(probs[i] - thr) / thr)
    if p.effective_top_k:
        for rank, i in enumerate(order):
            keep[i] = keep[i] and rank < p.effective_top_k
    if p.top_p < 1:
        mass = sum(probs[i] for i in range(len(z)) if keep[i])
        before = 0.0
        for i in order:
            if not keep[i]:
                continue
            margin = min(margin, abs(before - p.top_p))
            keep[i] = before < p.top_p
            before += probs[i] / mass
    return keep, margin


def ref_probs(logits: list[float], p: SamplingParams) -> list[float]:
    keep, _ = ref_keep(logits, p)
    w = [math.exp(x / p.temperature) if k else 0.0 for x, k in zip(logits, keep)]
    return [v / sum(w) for v in w]


def chi2_limit(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.719: p = 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def random_params(rng: random.Random, **kw) -> SamplingParams:
    base = dict(temperature=rng.choice([0.5, 0.8, 1.0, 1.3]), top_k=rng.choice([0, -1, 1, 3, 7]),
                top_p=rng.choice([1.0, 0.95, 0.7, 0.3]), min_p=rng.choice([0.0, 0.02, 0.2]))
    base.update(kw)
    return SamplingParams(**base)


# ---- SamplingParams ---------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("temperature", float("nan")), ("top_k", -2),
                                         ("top_k", 1.5), ("top_p", 0.0), ("top_p", 1.1), ("min_p", -0.1),
                                         ("min_p", 1.5), ("repetition_penalty", 0.0),
                                         ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                         ("seed", 1.0), ("max_tokens", 0), ("stop", [""]),
                                         ("stop_token_ids", [-1]), ("ignore_eos", 1), ("logprobs", -1),
                                         ("temperature", True), ("logit_bias", {1: 100.5}),
                                         ("logit_bias", {-1: 1.0}), ("logit_bias", {"3": 1.0}),
                                         ("logit_bias", {2: float("inf")}), ("logit_bias", [(1, 2.0)])])
def test_sampling_params_validation_names_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


def test_invalid_sampling_param_names_its_field():
    with pytest.raises(ValueError) as e:
        SamplingParams(logit_bias={4: -200})
    assert e.value.field == "logit_bias"


def test_sampling_params_normalises_stop():
    p = SamplingParams(stop="###", top_k=-1)
    assert p.stop == ["###"] and p.effective_top_k == 0 and not p.greedy
    assert SamplingParams(temperature=0).greedy


# ---- penalties and filters --------------------------------------------------------------------

def test_penalties_match_direct_formulas():
    rng = random.Random(1)
    V, B = 23, 9
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(1)) * 3
    params, prompts, outputs = [], [], []
    for b in range(B):
        params.append(SamplingParams(repetition_penalty=rng.choice([1.0, 1.3, 0.7]),
                                     presence_penalty=rng.uniform(-2, 2) if b % 3 else 0.0,
                                     frequency_penalty=rng.uniform(-2, 2) if b % 4 else 0.0))
        prompts.append([rng.randrange(V) for _ in range(rng.randrange(1, 12))])
        outputs.append([rng.randrange(V) for _ in range(rng.randrange(0, 15))])
    got = apply_penalties(logits, params, prompts, outputs)
    for b in range(B):
        want = ref_penalties(logits[b].double().tolist(), params[b], prompts[b], outputs[b])
        torch.testing.assert_close(got[b].double(), torch.tensor(want, dtype=torch.float64),
                                   rtol=1e-6, atol=1e-5)
    untouched = [b for b in range(B) if not params[b].has_penalties]
    assert untouched and torch.equal(got[untouched], logits[untouched])


def random_bias(rng: random.Random, vocab: int) -> dict[int, float]:
    return {t: rng.uniform(-100, 100) for t in rng.sample(range(vocab), rng.randrange(1, 6))}


def test_logit_bias_then_penalties_match_direct_formulas():
    """The bias is added to the model's logits (fp32, every listed token), the penalties act on the biased logits;
    rows without a bias stay bit-identical."""
    rng = random.Random(11)
    V, B = 29, 10
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(11)) * 3
    params, prompts, outputs = [], [], []
    for b in range(B):
        pen = dict(repetition_penalty=1.4, frequency_penalty=rng.uniform(-2, 2)) if b % 2 else {}
        params.append(SamplingParams(logit_bias=random_bias(rng, V) if b % 3 else None, **pen))
        prompts.append([rng.randrange(V) for _ in range(rng.randrange(1, 9))])
        outputs.append([rng.randrange(V) for _ in range(rng.randrange(0, 9))])
    biased = apply_logit_bias(logits, params)
    got = apply_penalties(logits, params, prompts, outputs)
    for b in range(B):
        want = logits[b].clone()
        for t, v in (params[b].logit_bias or {}).items():
            want[t] = want[t] + torch.tensor(v, dtype=torch.float32)  # fp32(logit) + fp32(bias), rounded once
        assert torch.equal(biased[b], want), b
        ref = ref_penalties(want.double().tolist(), params[b], prompts[b], outputs[b])
        torch.testing.assert_close(got[b].double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-6, atol=1e-5)
    plain = [b for b in range(B) if not params[b].has_logit_bias and not params[b].has_penalties]
    assert plain and torch.equal(got[plain], logits[plain])
    assert apply_logit_bias(logits, [SamplingParams(logit_bias={})] * B) is logits  # {} = off
    with pytest.raises(ValueError, match=f"logit_bias token id {V} is outside"):
        apply_logit_bias(logits, [SamplingParams(logit_bias={V: 1.0})] * B)


def test_logit_bias_steers_greedy_and_sampled_rows():
    """A -100 bias bans the greedy choice (the next best wins); sampled rows follow the softmax of the biased,
    tempered, filtered logits (chi-square); raw logprobs ignore the bias, processed ones include it."""
    V, n = 10, 20000
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(12)) * 2
    best, second = torch.topk(logits[0], 2).indices.tolist()
    greedy = SamplingParams(temperature=0, logit_bias={best: -100.0}, logprobs=1)
    out = Sampler()(logits, [greedy], [[0]], [[]])
    assert out.token_ids == [second]
    assert out.logprobs[0].top[0][0] == best  # raw: the model's own ranking
    processed = Sampler(logprobs_mode="processed")(logits, [greedy], [[0]], [[]])
    assert processed.logprobs[0].top[0][0] == second
    bias = {best: -3.0, 3: 2.5, 7: 1.0}
    p = SamplingParams(temperature=0.9, top_k=6, logit_bias=bias)
    biased = logits[0].double().tolist()
    for t, v in bias.items():
        biased[t] += v
    want = ref_probs(biased, p)
    draws = Sampler(generator=torch.Generator().manual_seed(13))(logits.expand(n, V).contiguous(), [p] * n,
                                                                  [[]] * n, [[]] * n)
    counts = [draws.token_ids.count(i) for i in range(V)]
    support = [i for i in range(V) if want[i] > 0]
    assert all(counts[i] == 0 for i in range(V) if want[i] == 0)
    chi2 = sum((counts[i] - n * want[i]) ** 2 / (n * want[i]) for i in support)
    assert chi2 < chi2_limit(len(support) - 1), (counts, [n * w for w in want])
    unbiased = ref_probs(logits[0].double().tolist(), SamplingParams(temperature=0.9, top_k=6))
    assert max(abs(a - b) for a, b in zip(want, unbiased)) > 0.05  # the bias did move the distribution


def test_filter_masks_match_float64_rederivation():
    rng = random.Random(2)
    gen = torch.Generator().manual_seed(2)
    checked = 0
    while checked < 300:
        V = rng.choice([5, 17, 64])
        logits = torch.randn(1, V, generator=gen) * rng.choice([0.5, 2.0, 6.0])
        p = random_params(rng)
        keep, margin = ref_keep(logits[0].double().tolist(), p)
        if margin < 1e-5:  # a float32 vs float64 coin flip, not a sampler property
            continue
        out = filter_logits(logits, [p])[0]
        assert torch.isfinite(out).tolist() == keep, (p, logits)
        want = logits[0] / p.temperature
        torch.testing.assert_close(out[torch.isfinite(out)], want[torch.tensor(keep)])
        checked += 1


def test_greedy_is_argmax_of_penalised_logits_ties_lowest_id():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(3))
    logits[0, 3] = logits[0, 7] = logits[0].max() + 1.0
    logits[1, :] = 0.25
    p_plain = SamplingParams(temperature=0, top_k=1, top_p=0.1)
    p_pen = SamplingParams(temperature=0, repetition_penalty=5.0, frequency_penalty=1.0)
    out = Sampler()(logits, [p_plain, p_plain, p_pen, p_pen], [[0]] * 4, [[], [], [2, 2], []])
    assert out.token_ids[:2] == [3, 0]
    for b in (2, 3):
        pen = ref_penalties(logits[b].double().tolist(), p_pen, [0], [[2, 2], []][b - 2])
        assert out.token_ids[b] == max(range(11), key=lambda i: (pen[i], -i))


# ---- distributions ----------------------------------------------------------------------------

@pytest.mark.parametrize("seeded", [False, True])
def test_draws_follow_filtered_softmax(seeded):
    V = 12
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(1, V, generator=gen) * 1.5
    p = SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.03, seed=0 if seeded else None)
    want = ref_probs(logits[0].double().tolist(), p)
    n = 3000 if seeded else 40000
    params = [SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.03, seed=i if seeded else None)
              for i in range(n)]
    gens = [make_generator(i) for i in range(n)] if seeded else None
    out = Sampler(generator=torch.Generator().manual_seed(5))(logits.expand(n, V).contiguous(), params,
                                                               [[]] * n, [[]] * n, gens)
    counts = [0] * V
    for t in out.token_ids:
        counts[t] += 1
    support = [i for i in range(V) if want[i] > 0]
    assert 2 <= len(support) < V  # the filters did remove something and left a real choice
    assert all(counts[i] == 0 for i in range(V) if want[i] == 0)
    chi2 = sum((counts[i] - n * want[i]) ** 2 / (n * want[i]) for i in support)
    assert chi2 < chi2_limit(len(support) - 1), (counts, [n * w for w in want])


def test_temperature_changes_distribution():
    V, n = 6, 30000
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).expand(n, V).contiguous()
    for temp in (0.4, 2.5):
        p = SamplingParams(temperature=temp)
        out = Sampler(generator=torch.Generator().manual_seed(6))(logits, [p] * n, [[]] * n, [[]] * n)
        want = ref_probs(logits[0].double().tolist(), p)
        counts = [out.token_ids.count(i) for i in range(V)]
        chi2 = sum((counts[i] - n * want[i]) ** 2 / (n * want[i]) for i in range(V))
        assert chi2 < chi2_limit(V - 1), (temp, counts)


# ---- seeded determinism -----------------------------------------------------------------------

def run_steps(rows: list[tuple[SamplingParams | None, int]], steps: int, V: int = 40) -> dict[int, list[int]]:
    """Rows are (params, logits seed); row ids are positions in `rows`. Each step's logits of a row come
    from its own logits seed, so a row sees the same logits whatever else is in the batch."""
    sampler = Sampler()
    gens = [make_generator(p.seed) if p.seed is not None else None for p, _ in rows]
    logit_gens = [torch.Generator().manual_seed(s) for _, s in rows]
    prompts = [[(7 * s + j) % V for j in range(5)] for _, s in rows]
    outs: list[list[int]] = [[] for _ in rows]
    for _ in range(steps):
        logits = torch.stack([torch.randn(V, generator=g) * 2 for g in logit_gens])
        res = sampler(logits, [p for p, _ in rows], prompts, outs, gens)
        for i, t in enumerate(res.token_ids):
            outs[i].append(t)
    return {i: o for i, o in enumerate(outs)}


def test_seeded_rows_independent_of_batch_composition():
    target = SamplingParams(temperature=1.1, top_p=0.9, top_k=20, repetition_penalty=1.2,
                            presence_penalty=0.5, seed=123)
    alone = run_steps([(target, 99)], 25)[0]
    rng = random.Random(8)
    for trial in range(4):
        others = [(random_params(rng, seed=rng.choice([None, rng.randrange(1000)])), rng.randrange(1000))
                  for _ in range(rng.randrange(1, 6))]
        pos = rng.randrange(len(others) + 1)
        rows = others[:pos] + [(target, 99)] + others[pos:]
        assert run_steps(rows, 25)[pos] == alone
    twins = run_steps([(target, 99), (target, 99)], 25)
    assert twins[0] == twins[1] == alone
    other_seed = SamplingParams(**{**target.__dict__, "seed": 124})
    assert run_steps([(other_seed, 99)], 25)[0] != alone


# ---- logprobs ---------------------------------------------------------------------------------

def test_raw_logprobs_match_float64_log_softmax():
    V = 30
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(9)) * 3
    logits[1, 4] = logits[1, 9] = logits[1].max() + 0.5  # tie for first place
    params = [SamplingParams(temperature=0.7, top_k=3, logprobs=5, seed=1),
              SamplingParams(temperature=0, logprobs=2, repetition_penalty=2.0),
              SamplingParams(temperature=1.0)]
    out = Sampler()(logits, params, [[4], [4], [1]], [[], [], []], [make_generator(1), None, None])
    assert out.logprobs[2] is None
    for b in (0, 1):
        ref = torch.log_softmax(logits[b].double(), -1)
        lp = out.logprobs[b]
        tok = out.token_ids[b]
        assert lp.logprob == pytest.approx(ref[tok].item(), abs=1e-5)
        assert lp.rank == 1 + int((ref > ref[tok]).sum())
        order = sorted(range(V), key=lambda i: (-ref[i].item(), i))[: params[b].logprobs]
        assert [i for i, _ in lp.top] == order
        assert [v for _, v in lp.top] == pytest.approx(ref[order].tolist(), abs=1e-5)
    assert [i for i, _ in out.logprobs[1].top] == [4, 9]
    # Penalised greedy: token 4 (in the prompt) is divided by 2, so 9 wins; raw logprobs ignore that
    # (4 and 9 tie, so both have rank 1).
    assert out.token_ids[1] == 9 and out.logprobs[1].rank == 1


def test_processed_logprobs_are_of_the_sampled_distribution():
    V = 16
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(10)).expand(2, V).contiguous()
    p = SamplingParams(temperature=0.5, top_k=4, logprobs=V, seed=3)
    out = Sampler(logprobs_mode="processed")(logits, [p, p], [[0], [0]], [[], []],
                                              [make_generator(3), make_generator(3)])
    want = ref_probs(logits[0].double().tolist(), p)
    top = dict(out.logprobs[0].top)
    for i in range(V):
        if want[i] == 0:
            assert top[i] == -math.inf
        else:
            assert top[i] == pytest.approx(math.log(want[i]), abs=1e-5)
    assert want[out.token_ids[0]] > 0 and out.token_ids[0] == out.token_ids[1]


@pytest.mark.parametrize("n_top", [0, 1, 2, 5])
def test_token_logprobs_against_float64_and_ties(n_top):
    """`token_logprobs` (prompt scoring, speculative rows): each token's log_softmax and the n best, ties -> lower id
    (rows with a tie for first place and an all-equal row), whichever way it finds them."""
    from dsv4.engine.sampler import token_logprobs
    gen = torch.Generator().manual_seed(14 + n_top)
    logits = torch.randn(5, 40, generator=gen) * 2
    logits[1, 7] = logits[1, 30] = logits[1].max() + 1
    logits[2] = 0.5
    tokens = torch.randint(0, 40, (5,), generator=gen).tolist()
    got = token_logprobs(logits, tokens, n_top)
    for row, t, lp in zip(logits, tokens, got):
        ref = torch.log_softmax(row.double(), -1)
        assert lp.token_id == t and lp.logprob == pytest.approx(ref[t].item(), abs=1e-6)
        order = sorted(range(40), key=lambda i: (-ref[i].item(), i))[:n_top]
        assert [i for i, _ in lp.top] == order
        assert [v for _, v in lp.top] == pytest.approx(ref[order].tolist(), abs=1e-6)
    if n_top:
        assert got[1].top[0][0] == 7 and got[2].top[0][0] == 0


def test_bad_inputs_raise():
    s = Sampler()
    logits = torch.randn(2, 8)
    p = SamplingParams()
    with pytest.raises(ValueError, match="dtype"):
        s(logits.double(), [p, p], [[1], [1]], [[], []])
    with pytest.raises(ValueError, match="2 rows"):
        s(logits[:1], [p, p], [[1], [1]], [[], []])
    with pytest.raises(ValueError, match="seed=5"):
        s(logits, [p, SamplingParams(seed=5)], [[1], [1]], [[], []])
    with pytest.raises(ValueError, match="output token ids"):
        s(logits, [p, SamplingParams(presence_penalty=1.0)], [[1], [1]], [[], [8]])
    with pytest.raises(ValueError, match="logprobs_mode"):
        Sampler(logprobs_mode="softmax")


@pytest.mark.parametrize("vocab", [129280, 8192 * 2, 1000])
def test_first_argmax_is_the_first_maximum(vocab):
    """The two-pass argmax against a plain scan for the first maximum: rows with ties (few distinct values, the
    maximum repeated across pieces), a NaN (counts as the largest), all -inf, and plain random rows."""
    from dsv4.engine.sampler import first_argmax
    gen = torch.Generator().manual_seed(vocab)
    rows = [torch.randn(vocab, generator=gen),
            torch.randint(0, 5, (vocab,), generator=gen).float(),  # the maximum 4.0 in many pieces
            torch.full((vocab,), -math.inf)]
    nan = torch.randn(vocab, generator=gen)
    nan[torch.randint(vocab // 2, vocab, (3,), generator=gen)] = math.nan
    rows.append(nan)
    x = torch.stack(rows)

    def scan(row):
        vals = row.tolist()
        if any(math.isnan(v) for v in vals):
            return next(i for i, v in enumerate(vals) if math.isnan(v))
        best = max(vals)
        return vals.index(best)

    got = first_argmax(x).tolist()
    assert got == [scan(r) for r in x]
    assert got == x.argmax(-1).tolist()
    assert first_argmax(x[1]).item() == scan(x[1])  # one row, no batch dimension
