"""dsv4.kernels.router.route_ref (the MoE gate's epilogue, shared by Gate's torch path) against the
gate formula written out in torch and a float64 scalar re-derivation, with exact ties at the top."""
from __future__ import annotations

import math

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.kernels.router import route_ref
from dsv4.model.moe import Gate


def _formula(logits, k, bias, tid2eid, token_ids, normalize, scale):
    """The gate epilogue as spelled in the spec (§2.9), in the logits' dtype."""
    s = torch.nn.functional.softplus(logits).sqrt()
    if tid2eid is not None:
        ids = tid2eid[token_ids]
    else:
        ids = torch.sort(s + bias, dim=-1, descending=True, stable=True).indices[:, :k]
    w = s.gather(1, ids)
    return (w / w.sum(-1, keepdim=True) if normalize else w) * scale, ids


def _rederive(logits, k, bias, tid2eid, token_ids, normalize, scale):
    """float64, one token at a time, plain Python: ids by (-key, id), weights from sqrt(log1p(exp))."""
    ws, ids = [], []
    for t, row in enumerate(logits.double().tolist()):
        s = [math.sqrt(math.log1p(math.exp(v))) for v in row]
        if tid2eid is not None:
            pick = tid2eid[token_ids[t]].tolist()
        else:
            key = [v + float(b) for v, b in zip(s, bias.double().tolist())]
            pick = sorted(range(len(key)), key=lambda e: (-key[e], e))[:k]
        tot = sum(s[e] for e in pick) if normalize else 1.0
        ws.append([s[e] / tot * scale for e in pick])
        ids.append(pick)
    return torch.tensor(ws, dtype=torch.float64), torch.tensor(ids)


def _tied(t, e, g, bias):
    """Random logits (several binades); each row's top key is repeated in up to 2 more columns of the
    same bias -> (logits, rows that got a tie)."""
    x = torch.randn(t, e, generator=g) * torch.exp2(torch.randint(-2, 4, (t, 1), generator=g).float())
    key = torch.nn.functional.softplus(x).sqrt() + bias
    tied = torch.zeros(t, dtype=torch.bool)
    for r, c in enumerate(key.argmax(1).tolist()):
        same = [j for j in torch.randperm(e, generator=g).tolist() if j != c and bias[j] == bias[c]][:2]
        x[r, same] = x[r, c].item()
        tied[r] = bool(same)
    return x, tied


@pytest.mark.parametrize("e,k", [(256, 6), (384, 6), (8, 2), (12, 3)])
@pytest.mark.parametrize("mode", ["bias", "hash"])
@pytest.mark.parametrize("normalize", [True, False])
def test_route_ref_matches_formula_and_float64(e, k, mode, normalize):
    g = torch.Generator().manual_seed(e + k)
    bias = torch.randint(0, 3, (e,), generator=g).float() * 0.0625
    x, tied = _tied(9, e, g, bias)
    assert tied.any()
    args = (x, k, bias, None, None, normalize, 2.5)
    if mode == "hash":
        t2e = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(20)])
        args = (x, k, None, t2e, torch.randint(0, 20, (9,), generator=g), normalize, 2.5)
    w, ids = route_ref(*args[:2], bias=args[2], tid2eid=args[3], token_ids=args[4], normalize=normalize,
                       route_scale=2.5)
    fw, fids = _formula(*args)
    assert torch.equal(ids, fids) and torch.equal(w, fw)
    w64, ids64 = _rederive(*args)
    assert torch.equal(ids, ids64)
    torch.testing.assert_close(w.double(), w64, rtol=2e-6, atol=0)
    if mode == "bias":  # the tied columns were taken lowest id first
        first, second = ids[tied, :1], ids[tied, 1:2]
        assert (second > first).all() and torch.equal(x[tied].gather(1, first), x[tied].gather(1, second))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_gate_torch_path_is_route_ref(dtype):
    cfg = tiny_config("fp4", layers="sliding,sliding")  # layer 0 hash-routed, layer 1 top-k
    g = torch.Generator().manual_seed(3)
    for spec in cfg.layers:
        gate = Gate(cfg, spec, dtype)
        assert gate.use_kernels is False
        w = torch.randn(gate.weight.shape, generator=g).to(dtype)
        w[3] = w[5] = w[1]  # experts 1, 3, 5: identical logits, so ties when their biases agree
        gate.weight.data.copy_(w)
        if gate.is_hash:
            gate.tid2eid.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:gate.top_k]
                                            for _ in range(cfg.vocab_size)]))
        else:
            gate.bias.data.copy_(torch.tensor([0.0, 0.1, 0.0, 0.1, 0.2, 0.1, -0.1, 0.0]))
        x = torch.randn(16, cfg.hidden_size, generator=g).to(dtype)
        tok = torch.randint(0, cfg.vocab_size, (16,), generator=g)
        got_w, got_ids = gate(x, tok)
        acc = torch.float32 if dtype == torch.bfloat16 else torch.float64
        logits = torch.nn.functional.linear(x.to(acc), gate.weight.to(acc))
        args = (logits, gate.top_k, None if gate.is_hash else gate.bias.to(acc),
                gate.tid2eid if gate.is_hash else None, tok, gate.normalize, gate.route_scale)
        fw, fids = _formula(*args)
        assert got_w.dtype == acc and torch.equal(got_ids, fids) and torch.equal(got_w, fw)
        w64, ids64 = _rederive(*args)
        assert torch.equal(got_ids, ids64)
        rtol = 2e-6 if acc == torch.float32 else 1e-9  # float64: torch's softplus threshold (x > 20 -> x)
        torch.testing.assert_close(got_w.double(), w64, rtol=rtol, atol=0)
        if not gate.is_hash:
            picked_tie = [r for r in got_ids.tolist() if 1 in r and 3 in r]
            assert all(r.index(1) < r.index(3) for r in picked_tie)
    with pytest.raises(ValueError, match="input_ids"):
        Gate(cfg, cfg.layers[0], dtype)(x, None)


@pytest.mark.parametrize("n", [1, 12, 63, 64, 65, 252, 1000])
def test_route_ref_scores_equal_logits_equally_at_any_position(n):
    """Equal logits give bit-equal scores wherever they sit, in one tensor or across tensors of other sizes (torch's
    AVX512 softplus rounds a tensor's last partial vector through the scalar function, 1 ulp apart for ≈ 12 % of
    values: 28 of 252 equal logits scored higher before `_position_invariant`)."""
    from dsv4.kernels.router import _position_invariant

    def score(y):
        return _position_invariant(lambda z: torch.nn.functional.softplus(z).sqrt(), y)

    values = torch.randn(40, generator=torch.Generator().manual_seed(n)) * 3
    alone = score(values)  # each value once, one small tensor
    for v, want in zip(values.tolist(), alone.tolist()):
        s = score(torch.full((n,), v))
        assert s.shape == (n,) and torch.unique(s).tolist() == [want], f"{n} copies of {v}: {torch.unique(s)}"
        assert abs(want - math.sqrt(math.log1p(math.exp(v)))) <= 2e-7 * want
    w, ids = route_ref(torch.full((3, n), 0.25), min(n, 4))
    assert torch.equal(ids, torch.arange(min(n, 4)).expand(3, -1))  # all tied: lowest ids first
