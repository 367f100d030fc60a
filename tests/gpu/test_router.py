"""Fused MoE router epilogue (dsv4.kernels.router.route) vs its torch reference (Gate's own path) and a
float64 re-derivation: fresh random logits over several binades, exact ties at the top (duplicate
columns with equal bias), bias / no bias / hash routing, normalisation on and off, outputs poisoned.
The fused decode path (`gate_route`: logits GEMV + route in one launch) against a float64 GEMM and
against `route_ref` on its own logits (see `test_gate_route_matches_float64` for near-ties)."""

from __future__ import annotations

import math
import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
INTERP = os.environ.get("TRITON_INTERPRET") == "1"  # no libdevice there: scores a few ulps off


def _logits(t, e, g):
    """[t, e] fp32 logits, rows scaled by 2^[-2, 3] (never all zero)."""
    scale = torch.exp2(torch.randint(-2, 4, (t, 1), generator=g, device=DEV).float())
    return torch.randn(t, e, generator=g, device=DEV) * scale


def _tie_top(x, bias, g, n=3):
    """Copy each row's top key column into up to n other columns of the same bias (exact ties at the
    top) -> rows that got a tie."""
    key = torch.nn.functional.softplus(x).sqrt() + (0 if bias is None else bias)
    rows, top = torch.arange(x.shape[0], device=DEV), key.argmax(dim=1)
    same = torch.ones_like(x, dtype=torch.bool) if bias is None else bias[None, :] == bias[top][:, None]
    r = torch.rand(x.shape, generator=g, device=DEV).masked_fill(~same, -1.0)
    r[rows, top] = -1.0
    pick = r.topk(n, dim=1)
    ok = pick.values >= 0  # random other columns with the same bias
    x.scatter_(1, pick.indices, torch.where(ok, x[rows, top][:, None], x.gather(1, pick.indices)))
    return ok.any(dim=1)


def _ulps(a, b):
    """Distance in fp32 units in the last place (both non-negative)."""
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


def _check(got, want, logits, bias, normalize, scale):
    (w, i), (wr, ir) = got, want
    assert w.dtype == torch.float32 and i.dtype == torch.int64 and w.shape == wr.shape == i.shape
    assert torch.isfinite(w).all() and (w > 0).all(), "unwritten or wrong weights"
    assert torch.equal(i, ir), f"ids differ in rows {torch.where((i != ir).any(1))[0].tolist()}"
    if INTERP:
        torch.testing.assert_close(w, wr, rtol=1e-5, atol=0)
    else:  # libdevice = torch's math: bit-identical, but for the order of the normalising sum
        worst = int(_ulps(w, wr).max())
        # normalised: the kernel's k-term sum of positive terms is not in torch's order: each order is within
        # (k-1)/2 ulp of the exact sum, so the two sums within k-1 ulp, plus the division's own rounding
        # (seen on the H200: 3 ulp at E = 384, D = 7168)
        assert worst <= (w.shape[1] if normalize else 0), f"weights differ by {worst} ulp"
    # float64 re-derivation of the weights from the picked ids
    s = torch.sqrt(torch.log1p(torch.exp(logits.double())))
    w64 = s.gather(1, i)
    if normalize:
        w64 = w64 / w64.sum(1, keepdim=True)
    torch.testing.assert_close(w.double(), w64 * scale, rtol=2e-6, atol=0)


CASES = [(256, 6), (384, 6), (8, 2), (16, 4), (12, 3)]  # (E, k): Flash, Pro, tiny (12: padded to 16)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("mode", ["bias", "plain", "hash"])
@pytest.mark.parametrize("e,k", CASES)
@pytest.mark.parametrize("t", [1, 21])
def test_route_matches_reference(e, k, mode, normalize, t, poison):
    from dsv4.kernels.router import route, route_ref

    g = torch.Generator(device=DEV).manual_seed(e * 1000 + k * 10 + t)
    bias = None
    if mode == "bias":  # few distinct values, so that tied columns can share one
        bias = torch.randint(-2 if e >= 64 else 0, 3 if e >= 64 else 2, (e,), generator=g, device=DEV) * 0.125
    x = _logits(t, e, g)
    kw = dict(normalize=normalize, route_scale=2.5)
    if mode == "hash":
        tid2eid = torch.stack([torch.randperm(e, generator=g, device=DEV)[:k] for _ in range(50)])
        kw.update(tid2eid=tid2eid, token_ids=torch.randint(0, 50, (t,), generator=g, device=DEV))
    else:
        tied = _tie_top(x, bias, g, n=min(3, e - 1))
        assert tied.float().mean() > 0.5
        kw.update(bias=bias)
    want = route_ref(x, k, **kw)
    if mode != "hash":  # the ties are there, and go to the lowest ids first
        first, second = want[1][tied, 0], want[1][tied, 1]
        assert torch.equal(x[tied].gather(1, first[:, None]), x[tied].gather(1, second[:, None]))
        assert (second > first).all()
    poison()
    got = route(x, k, **kw)
    _check(got, want, x, bias, normalize, 2.5)


def test_route_extreme_logits(poison):
    """Both softplus branches, its threshold, and denormal softplus values (FTZ must be off)."""
    from dsv4.kernels.router import route, route_ref

    vals = torch.tensor([-100.0, -87.5, -30.0, -1e-3, 0.0, 19.99, 20.0, 20.01, 25.0, 90.0], device=DEV)
    e = 16
    x = torch.full((len(vals), e), -5.0, device=DEV)
    x[:, 3] = vals
    tid2eid = torch.tensor([[3, 0]], device=DEV)
    tok = torch.zeros(len(vals), dtype=torch.int64, device=DEV)
    for normalize in (False, True):
        want = route_ref(x, 2, tid2eid=tid2eid, token_ids=tok, normalize=normalize)
        poison()
        got = route(x, 2, tid2eid=tid2eid, token_ids=tok, normalize=normalize)
        assert torch.equal(got[1], want[1])
        if INTERP:
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-22)  # denormal exp
        else:
            assert int(_ulps(got[0], want[0]).max()) <= (2 if normalize else 0), (got[0], want[0])


@pytest.mark.parametrize("mode", ["bias", "plain", "hash"])
@pytest.mark.parametrize("e,k", [(256, 6), (384, 6)])  # 384: padded to 512
def test_route_special_values(e, k, mode, poison):
    """NaN logits rank first (torch's sort), -inf scores 0, exact ties go to the lowest id; a hash table's bad
    entries give NaN weights. `route` and `gate_route` (no normalisation: each weight on its own) against
    `route_ref` on the same logits."""
    from dsv4.kernels.router import gate_route, route, route_ref

    t = 5
    g = torch.Generator(device=DEV).manual_seed(e * 31 + k + len(mode))
    bias = torch.randint(-2, 3, (e,), generator=g, device=DEV) * 0.125 if mode == "bias" else None
    x = _logits(t, e, g)
    _tie_top(x, bias, g, n=min(3, e - 1))
    x[1, 2], x[2, e - 1], x[2, 5], x[3, 0] = float("nan"), float("nan"), float("nan"), float("-inf")
    kw = dict(bias=bias, normalize=False)
    bad = torch.zeros(t, k, dtype=torch.bool, device=DEV)
    if mode == "hash":
        tid2eid = torch.stack([torch.randperm(e, generator=g, device=DEV)[:k] for _ in range(8)])
        tid2eid[3, 0], tid2eid[5, k - 1] = -1, e
        tok = torch.tensor([0, 3, 5, 1, 3], device=DEV)
        tid2eid[1, 1] = 0  # row 3 picks the -inf logit
        kw = dict(tid2eid=tid2eid, token_ids=tok, normalize=False)
        bad = (tid2eid[tok] < 0) | (tid2eid[tok] >= e)
    xg, wg = _gate_inputs(t, e, 64, g)
    for name, (w, ids), logits in (("route", route(x, k, **kw), x),
                                   ("gate_route", gate_route(xg, wg, k, **kw, block_k=32)[:2], None)):
        if logits is None:
            logits = gate_route(xg, wg, k, **kw, block_k=32)[2]
        if mode == "hash":  # route_ref cannot index bad entries: the good ones against a cleaned table
            assert torch.equal(ids, tid2eid[tok]), name
            assert torch.equal(w.isnan(), bad), f"{name}: NaN weights exactly at the bad entries"
            wr, _ = route_ref(logits, k, tid2eid=tid2eid.clamp(0, e - 1), token_ids=tok, normalize=False)
        else:
            wr, ir = route_ref(logits, k, **kw)
            assert torch.equal(ids, ir), f"{name}: ids differ in rows {torch.where((ids != ir).any(1))[0].tolist()}"
            if name == "route":
                assert set(ids[1, :1].tolist() + ids[2, :2].tolist()) == {2, 5, e - 1}, "NaN keys must rank first"
        ok = ~bad & ~wr.isnan()
        assert torch.equal(w.isnan(), ~ok & ~bad | bad), f"{name}: NaN weights where the reference has them"
        if INTERP:
            torch.testing.assert_close(w[ok], wr[ok], rtol=1e-5, atol=1e-30)
        else:
            assert torch.equal(w[ok], wr[ok]), f"{name}: weights differ"


def test_route_rejects_bad_arguments():
    from dsv4.kernels.router import route

    x = torch.randn(3, 16, device=DEV)
    t2e = torch.zeros(10, 2, dtype=torch.int64, device=DEV)
    tok = torch.zeros(3, dtype=torch.int64, device=DEV)
    bad = [
        dict(logits=x.double(), k=2), dict(logits=x[:, ::2], k=2), dict(logits=x, k=0), dict(logits=x, k=17),
        dict(logits=x, k=2, bias=torch.zeros(8, device=DEV)),
        dict(logits=x, k=2, bias=torch.zeros(16, device=DEV, dtype=torch.bfloat16)),
        dict(logits=x, k=2, tid2eid=t2e), dict(logits=x, k=3, tid2eid=t2e, token_ids=tok),
        dict(logits=x, k=2, tid2eid=t2e, token_ids=tok[:2]), dict(logits=x, k=2, tid2eid=t2e.float(), token_ids=tok),
        dict(logits=x, k=2, token_ids=tok),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            route(**kw)
    w, i = route(x[:0], 2)
    assert w.shape == i.shape == (0, 2)


def _pairwise_sum(w):
    """fp32 row sums in the kernel's order: v[t] + v[t+P] (P = pow2 <= k), then adjacent pairs."""
    p = 1 << (w.shape[1].bit_length() - 1)
    v = w[:, :p].clone()
    v[:, :w.shape[1] - p] += w[:, p:]
    while v.shape[1] > 1:
        v = v[:, 0::2] + v[:, 1::2]
    return v[:, 0]


@pytest.mark.parametrize("k", [1, 3, 6, 8, 13, 33])
def test_normalising_sum_order(k):
    """Normalised = unnormalised / (the documented pairwise sum) * scale, bit for bit; on CUDA also
    how often torch's own sum agrees with that order (it need not)."""
    from dsv4.kernels.router import route

    g = torch.Generator(device=DEV).manual_seed(k)
    x = _logits(16, 40, g)
    raw, ids = route(x, k, normalize=False)
    w, ids2 = route(x, k, normalize=True, route_scale=1.7)
    assert torch.equal(ids, ids2)
    total = _pairwise_sum(raw)
    assert torch.equal(w, raw / total[:, None] * 1.7)
    print(f"k={k}: torch's sum == pairwise order in {float((raw.sum(-1) == total).float().mean()):.0%} of rows")


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need CUDA")
def test_route_in_cuda_graph_and_gate():
    """No host syncs: the launch captures into a CUDA graph; Gate's kernel path = its torch path (past
    GATE_ROUTE_MAX_T rows: the logits GEMM, then `route`)."""
    from dsv4.checkpoint.writer import tiny_config
    from dsv4.kernels.router import route, route_ref
    from dsv4.model.moe import Gate

    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(4, 256, generator=g, device=DEV) * 3
    bias = torch.randn(256, generator=g, device=DEV) * 0.1
    route(x, 6, bias=bias)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, i = route(x, 6, bias=bias)
    x.copy_(torch.randn(4, 256, generator=g, device=DEV) * 3)
    graph.replay()
    want = route_ref(x, 6, bias=bias)
    assert torch.equal(i, want[1]) and int(_ulps(w, want[0]).max()) <= 2

    cfg = tiny_config("fp4", layers="sliding,sliding")
    for spec in cfg.layers:  # layer 0 hash-routed, layer 1 top-k
        gate = Gate(cfg, spec, torch.bfloat16).to(DEV)
        gate.weight.normal_(generator=g)
        if gate.is_hash:
            gate.tid2eid.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, device=DEV)[:gate.top_k]
                                            for _ in range(cfg.vocab_size)]))
        else:
            gate.bias.normal_(generator=g).mul_(0.1)
        h = torch.randn(24, cfg.hidden_size, generator=g, device=DEV).to(torch.bfloat16)
        tok = torch.randint(0, cfg.vocab_size, (24,), generator=g, device=DEV)
        want = gate(h, tok)
        gate.use_kernels = True
        got = gate(h, tok)
        assert torch.equal(got[1], want[1]) and int(_ulps(got[0], want[0]).max()) <= 2


# --------------------------------------------------------------------------- gate_route (GEMV + route)

TIED = (5, 17, 200)  # identical weight rows and biases: exact ties, to be taken lowest id first
U32 = 2.0 ** -24


def _gate_inputs(t, e, d, g):
    """bf16 x [t, d], W [e, d] (logits of std ~2, rows scaled by 2^[-1, 1]); odd rows point at the
    TIED experts (whose logits then lead by ~24)."""
    w = torch.randn(e, d, generator=g, device=DEV) * (2.0 / math.sqrt(d))
    w[list(TIED)] = w[TIED[0]].clone()
    w = w.to(torch.bfloat16)
    x = torch.randn(t, d, generator=g, device=DEV) * torch.exp2(torch.randint(-1, 2, (t, 1), generator=g,
                                                                               device=DEV).float())
    x[1::2] = torch.randn(x[1::2].shape, generator=g, device=DEV) + 6.0 * w[TIED[0]].float()
    return x.to(torch.bfloat16), w


def _near_tie_rows(logits64, bias, k, err):
    """Rows where an fp32 computation of the keys may order the first k+1 differently from float64:
    two neighbours (descending float64 keys) closer than the keys' possible fp32 error. err [T] bounds
    each row's |fp32 logit - float64 logit|; |d sqrt(softplus(x)) / dx| < 1/3, so each key moves by
    < err/2 from its logit, plus < 8 ulp from the scores' math and the bias add: neighbours further
    apart than err + 16 ulp keep their order. Exact float64 ties (duplicated weight rows) are exact
    fp32 ties too and not counted."""
    key = torch.sqrt(torch.log1p(torch.exp(logits64)))
    if bias is not None:
        key = key + bias.double()
    top = key.sort(dim=1, descending=True, stable=True).values[:, :k + 1]
    gap = top[:, :-1] - top[:, 1:]
    tol = err[:, None] + 16 * U32 * (top[:, :-1].abs() + 1.0)
    return ((gap > 0) & (gap <= tol)).any(dim=1)


GATE_SHAPES = [(256, 4096), (384, 7168)] if DEV == "cuda" else [(256, 200), (384, 200)]  # (E, D)
# the default tiling, and a small one (several hidden slices, a ragged last slice / expert tile)
GATE_CONFIGS = [{}, dict(block_n=256, block_k=64, rows_per_group=2)]


@pytest.mark.parametrize("mode", ["bias", "plain", "hash"])
@pytest.mark.parametrize("e,d", GATE_SHAPES)
@pytest.mark.parametrize("t", [1, 3, 8, 16])
def test_gate_route_matches_float64(t, e, d, mode, poison):
    """Logits within the fp32 summation bound of a float64 GEMM; ids / weights = `route_ref` on the
    kernel's own logits (ids exact, weights as `route`'s); ids = the float64 order except in near-tied
    rows, where the kernel's fp32 order and float64 may legitimately part: two of the first k+1
    float64 keys closer than the row's measured logit error plus 16 ulp (`_near_tie_rows`). Those
    rows are only counted, and must be few. Repeated calls give the same bits and leave the arrival counters zero."""
    from dsv4.kernels._triton import arrival_counters
    from dsv4.kernels.router import gate_route, route_ref

    k, scale = 6, 2.5
    g = torch.Generator(device=DEV).manual_seed(t * 7919 + e + len(mode))
    x, w = _gate_inputs(t, e, d, g)
    bias, kw = None, dict(normalize=mode != "plain", route_scale=scale)
    if mode == "bias":
        bias = torch.randint(-2, 3, (e,), generator=g, device=DEV) * 0.125
        bias[list(TIED)] = bias[TIED[0]].clone()
        kw.update(bias=bias)
    if mode == "hash":
        tid2eid = torch.stack([torch.randperm(e, generator=g, device=DEV)[:k] for _ in range(50)])
        tok = torch.randint(0, 50, (t,), generator=g, device=DEV)
        kw.update(tid2eid=tid2eid, token_ids=tok)
    prods = x.double()[:, None, :] * w.double()[None, :, :]  # exact: bf16 x bf16
    ref64, bound = prods.sum(-1), d * U32 * prods.abs().sum(-1)
    ref64[:, list(TIED)] = ref64[:, TIED[0]].clone()[:, None]  # equal by construction: no reduction-order doubt
    # CUDA: every tiling; the interpreter: one of them per case (time)
    for cfg in GATE_CONFIGS if DEV == "cuda" else [GATE_CONFIGS[(t + len(mode)) % 2]]:
        poison()
        wts, ids, logits = gate_route(x, w, k, **kw, **cfg)
        assert logits.dtype == torch.float32 and logits.shape == (t, e)
        assert ((logits.double() - ref64).abs() <= bound).all(), "logits outside the fp32 summation bound"
        tied_rows = torch.arange(t, device=DEV)[1::2]
        assert (logits[tied_rows][:, list(TIED)] == logits[tied_rows, TIED[0]][:, None]).all()

        want = route_ref(logits, k, **kw)
        _check((wts, ids), want, logits, bias, kw["normalize"], scale)
        if mode == "hash":
            assert torch.equal(ids, tid2eid[tok])
        else:
            assert (ids[tied_rows, :3] == torch.tensor(TIED, device=DEV)).all(), "exact ties not lowest id first"
            ids64 = route_ref(ref64, k, bias=None if bias is None else bias.double())[1]
            near = _near_tie_rows(ref64, bias, k, (logits.double() - ref64).abs().max(dim=1).values)
            assert int(near.sum()) <= max(1, t // 4), f"{int(near.sum())} near-tied rows of {t}: bad test data?"
            assert torch.equal(ids[~near], ids64[~near]), "ids differ from the float64 order away from near-ties"
        # weights against float64 scores at the picked ids (from the float64 logits)
        s64 = torch.sqrt(torch.log1p(torch.exp(ref64))).gather(1, ids)
        w64 = (s64 / s64.sum(1, keepdim=True) if kw["normalize"] else s64) * scale
        torch.testing.assert_close(wts.double(), w64, rtol=1e-4, atol=0)

        assert not arrival_counters("router gate_route", x.device, 1).any(), "arrival counters left non-zero"
        if t <= 3 or DEV == "cuda":  # the same launch again (interpreter: small T only, for time)
            again = gate_route(x, w, k, **kw, **cfg)
            assert all(torch.equal(a, b) for a, b in zip(again, (wts, ids, logits))), "repeated call differs"


def test_gate_route_rows_independent_of_batch():
    """A row's logits, ids and weights do not depend on the other rows, on T or on the row grouping."""
    from dsv4.kernels.router import gate_route

    e, d = GATE_SHAPES[0]
    g = torch.Generator(device=DEV).manual_seed(77)
    x, w = _gate_inputs(7, e, d, g)
    bias = torch.randn(e, generator=g, device=DEV) * 0.1
    full = gate_route(x, w, 6, bias=bias, rows_per_group=4)
    for rows, rb in ((slice(0, 1), 4), (slice(2, 7), 2)):
        part = gate_route(x[rows], w, 6, bias=bias, rows_per_group=rb)
        assert all(torch.equal(a[rows], b) for a, b in zip(full, part)), (rows, rb)


def test_gate_route_rejects_bad_arguments():
    from dsv4.kernels.router import gate_route

    x = torch.randn(2, 64, device=DEV).to(torch.bfloat16)
    w = torch.randn(16, 64, device=DEV).to(torch.bfloat16)
    t2e = torch.zeros(10, 2, dtype=torch.int64, device=DEV)
    tok = torch.zeros(2, dtype=torch.int64, device=DEV)
    bad = [
        dict(x=x.float(), weight=w, k=2), dict(x=x, weight=w.float(), k=2), dict(x=x, weight=w[:, :32], k=2),
        dict(x=x[:, ::2], weight=w[:, ::2], k=2), dict(x=x[0], weight=w, k=2), dict(x=x, weight=w, k=0),
        dict(x=x, weight=w, k=17), dict(x=x, weight=w, k=2, bias=torch.zeros(8, device=DEV)),
        dict(x=x, weight=w, k=2, tid2eid=t2e), dict(x=x, weight=w, k=2, tid2eid=t2e, token_ids=tok[:1]),
        dict(x=x, weight=w, k=2, token_ids=tok), dict(x=x, weight=w, k=2, block_n=12),
        dict(x=x, weight=w, k=2, block_k=48), dict(x=x[:, :0], weight=w[:, :0], k=2),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            gate_route(**kw)
    wts, ids, logits = gate_route(x[:0], w, 2)
    assert wts.shape == ids.shape == (0, 2) and logits.shape == (0, 16)


def test_gate_fused_path(monkeypatch):
    """Gate in kernel mode: 1..GATE_ROUTE_MAX_T bf16 rows take `gate_route` (same bits as calling it),
    more rows the GEMM + route path; both agree with Gate's torch path (ids where no near-tie)."""
    from dsv4.checkpoint.writer import tiny_config
    from dsv4.kernels import router
    from dsv4.model import moe

    calls = []
    monkeypatch.setattr(moe, "gate_route", lambda *a, **kw: calls.append(a[0].shape[0]) or router.gate_route(*a, **kw))
    g = torch.Generator(device=DEV).manual_seed(5)
    cfg = tiny_config("fp4", layers="sliding,sliding")
    for spec in cfg.layers:  # layer 0 hash-routed, layer 1 top-k
        gate = moe.Gate(cfg, spec, torch.bfloat16).to(DEV)
        gate.weight.normal_(generator=g)
        if gate.is_hash:
            gate.tid2eid.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=g, device=DEV)
                                            [:gate.top_k] for _ in range(cfg.vocab_size)]))
        else:
            gate.bias.normal_(generator=g).mul_(0.1)
        for t in (1, 5, router.GATE_ROUTE_MAX_T + 1):
            h = torch.randn(t, cfg.hidden_size, generator=g, device=DEV).to(torch.bfloat16)
            tok = torch.randint(0, cfg.vocab_size, (t,), generator=g, device=DEV)
            gate.use_kernels = False
            want_w, want_ids = gate(h, tok)
            gate.use_kernels = True
            calls.clear()
            got_w, got_ids = gate(h, tok)
            if t > router.GATE_ROUTE_MAX_T:
                assert not calls
                continue
            assert calls == [t]
            args = dict(bias=None if gate.is_hash else gate.bias, tid2eid=gate.tid2eid if gate.is_hash else None,
                        token_ids=tok if gate.is_hash else None, normalize=gate.normalize,
                        route_scale=gate.route_scale)
            direct = router.gate_route(h, gate.weight, gate.top_k, **args)
            assert torch.equal(got_w, direct[0]) and torch.equal(got_ids, direct[1])
            ref64 = h.double() @ gate.weight.double().T
            # both paths' logits are within D u sum|x w| of float64 (any fp32 summation order)
            err = cfg.hidden_size * U32 * (h.double().abs() @ gate.weight.double().abs().T).max(1).values
            near = _near_tie_rows(ref64, None if gate.is_hash else gate.bias, gate.top_k, err)
            assert torch.equal(got_ids[~near], want_ids[~near])
            torch.testing.assert_close(got_w[~near], want_w[~near], rtol=1e-4, atol=0)


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need CUDA")
def test_gate_route_in_cuda_graph():
    """Captured once, replayed on new inputs: the eager bits (the counters reset each launch); other
    tilings give the same logits to fp32 rounding."""
    from dsv4.kernels.router import gate_route

    for e, d in GATE_SHAPES:
        g = torch.Generator(device=DEV).manual_seed(e)
        for t in (1, 4, 16):
            x, w = _gate_inputs(t, e, d, g)
            bias = torch.randn(e, generator=g, device=DEV) * 0.1
            gate_route(x, w, 6, bias=bias)  # compile and allocate the counters outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = gate_route(x, w, 6, bias=bias)
            for _ in range(3):
                x.copy_(_gate_inputs(t, e, d, g)[0])
                graph.replay()
                want = gate_route(x, w, 6, bias=bias)
                assert all(torch.equal(a, b) for a, b in zip(out, want))

            for cfg in OTHER_TILINGS:
                # another tiling sums in another order: the logits agree to fp32 rounding (ids may not, at near-ties)
                torch.testing.assert_close(gate_route(x, w, 6, bias=bias, **cfg)[2], out[2], rtol=1e-5, atol=1e-5)


# launch shapes besides the default (timings belong to bench/, not to tests)
OTHER_TILINGS = [dict(num_warps=1, block_n=8, block_k=256), dict(num_warps=2, block_n=8, block_k=512),
                 dict(num_warps=4, block_n=16, block_k=1024), dict(num_warps=8, block_n=16, block_k=1024)]
