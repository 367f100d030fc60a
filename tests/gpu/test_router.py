"""Fused MoE router epilogue (dsv4.kernels.router.route) vs its torch reference (Gate's own path) and a
float64 re-derivation: fresh random logits over several binades, exact ties at the top (duplicate
columns with equal bias), bias / no bias / hash routing, normalisation on and off, outputs poisoned."""

from __future__ import annotations

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
        # normalised: the kernel's 6-term sum is not in torch's order (1 ulp) and the division rounds again
        assert worst <= (2 if normalize else 0), f"weights differ by {worst} ulp"
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
    """No host syncs: the launch captures into a CUDA graph; Gate's kernel path = its torch path."""
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
        h = torch.randn(9, cfg.hidden_size, generator=g, device=DEV).to(torch.bfloat16)
        tok = torch.randint(0, cfg.vocab_size, (9,), generator=g, device=DEV)
        want = gate(h, tok)
        gate.use_kernels = True
        got = gate(h, tok)
        assert torch.equal(got[1], want[1]) and int(_ulps(got[0], want[0]).max()) <= 2
