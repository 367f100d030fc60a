"""Unit tests of the reference model's modules against independent float64 re-derivations of the
spec formulas (deepseek_v4_model.md §2): mHC, RoPE, one attention layer, MoE. The re-derivations work
token by token with scalar/complex arithmetic and read only the weights from the modules. The model's
state, input and weight-loading rules and its API are in test_model_units_api.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from _model_units_helpers import F64, build, rel
from dsv4.checkpoint.writer import tiny_config
from dsv4.config import ModelConfig
from dsv4.model import SequenceState
from dsv4.model.context import Segment
from dsv4.model.hyper import hc_head, hc_post, hc_pre, sinkhorn
from dsv4.model.indexer import top_k_lowest_index
from dsv4.model.rope import RotaryEmbedding, apply_rope, rope_frequencies, yarn_correction_range
from dsv4.quant.fp8 import fake_quant_fp8
from dsv4.quant.mxfp4 import fake_quant_fp4

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "configs"
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures/configs")


# ---- independent scalar / complex re-derivations -------------------------------------------------

def ref_rms(x, w=None, eps=1e-6):
    y = x / torch.sqrt((x * x).mean() + eps)
    return y if w is None else y * w.double()


def ref_omega(rope_dim: int, theta: float, yarn) -> torch.Tensor:
    i = torch.arange(rope_dim // 2, dtype=F64)
    omega = theta ** (-2 * i / rope_dim)
    if yarn is not None:
        def c(n):
            l0 = yarn.original_max_position_embeddings
            return rope_dim * math.log(l0 / (2 * math.pi * n)) / (2 * math.log(theta))
        lo, hi = max(math.floor(c(yarn.beta_fast)), 0), min(math.ceil(c(yarn.beta_slow)), rope_dim - 1)
        ramp = ((i - lo) / (hi - lo)).clamp(0, 1)
        omega = omega / yarn.factor * ramp + omega * (1 - ramp)
    return omega


def ref_rope(x: torch.Tensor, p: int, omega: torch.Tensor) -> torch.Tensor:
    """Rotate the trailing 2n dims as complex numbers x[2i] + i x[2i+1] by e^{i p omega_i};
    angles fp32(p) * fp32(omega) as the spec prescribes."""
    n = omega.shape[0]
    ang = (torch.tensor(float(abs(p)), dtype=torch.float32) * omega.float()).double() * (1 if p >= 0 else -1)
    tail = x[..., -2 * n:]
    z = torch.complex(tail[..., 0::2], tail[..., 1::2]) * torch.polar(torch.ones_like(ang), ang)
    out = x.clone()
    out[..., -2 * n::2], out[..., -2 * n + 1::2] = z.real, z.imag
    return out


def ref_hadamard(n: int) -> torch.Tensor:
    idx = range(n)
    return torch.tensor([[(-1) ** bin(i & j).count("1") for j in idx] for i in idx], dtype=F64) / math.sqrt(n)


def ref_sinkhorn(a: list[list[float]], iters: int, eps: float) -> list[list[float]]:
    n = len(a)
    c = []
    for row in a:
        mx = max(row)
        e = [math.exp(v - mx) for v in row]
        s = sum(e)
        c.append([v / s + eps for v in e])

    def col_step():
        for k in range(n):
            s = sum(c[j][k] for j in range(n)) + eps
            for j in range(n):
                c[j][k] /= s

    col_step()
    for _ in range(iters - 1):
        for j in range(n):
            s = sum(c[j]) + eps
            c[j] = [v / s for v in c[j]]
        col_step()
    return c


def sig(v: float) -> float:
    return 1 / (1 + math.exp(-v))


# ---- mHC -----------------------------------------------------------------------------------------

def test_sinkhorn_matches_scalar_rederivation():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 4, 4, generator=g, dtype=F64) * 3
    got = sinkhorn(logits, 20, 1e-6)
    for t in range(5):
        want = torch.tensor(ref_sinkhorn(logits[t].tolist(), 20, 1e-6), dtype=F64)
        assert torch.allclose(got[t], want, rtol=1e-13, atol=0)
    assert torch.allclose(got.sum(-2), torch.ones(5, 4, dtype=F64), atol=1e-5)  # last step: columns
    assert not torch.allclose(got, got.transpose(1, 2), atol=1e-3)  # not symmetric: orientation matters


def test_hc_pre_post_head_match_rederivation():
    g = torch.Generator().manual_seed(2)
    t, hc, d = 3, 4, 16
    x = torch.randn(t, hc, d, generator=g, dtype=F64)
    fn = torch.randn(24, hc * d, generator=g, dtype=F64) * 0.2
    base, scale = torch.randn(24, generator=g, dtype=F64) * 0.3, torch.rand(3, generator=g, dtype=F64) + 0.5
    f = torch.randn(t, d, generator=g, dtype=F64)
    u, post, comb = hc_pre(x, fn, base, scale, sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
    out = hc_post(f, x, post, comb)
    head_fn, head_base, head_scale = fn[:4], base[:4], scale[:1]
    y = hc_head(x, head_fn, head_base, head_scale, hc_eps=1e-6, norm_eps=1e-6)
    for i in range(t):
        xh = x[i].flatten().tolist()
        rho = 1 / math.sqrt(sum(v * v for v in xh) / len(xh) + 1e-6)
        m = [rho * sum(a * b for a, b in zip(fn[r].tolist(), xh)) for r in range(24)]
        b, s = base.tolist(), scale.tolist()
        pre = [sig(m[j] * s[0] + b[j]) + 1e-6 for j in range(4)]
        pst = [2 * sig(m[4 + j] * s[1] + b[4 + j]) for j in range(4)]
        a = [[m[8 + 4 * j + k] * s[2] + b[8 + 4 * j + k] for k in range(4)] for j in range(4)]
        c = ref_sinkhorn(a, 20, 1e-6)
        want_u = sum(pre[j] * x[i, j] for j in range(4))
        want_out = torch.stack([pst[k] * f[i] + sum(c[j][k] * x[i, j] for j in range(4)) for k in range(4)])
        hw = [sig(m[j] * head_scale.item() + head_base[j].item()) + 1e-6 for j in range(4)]
        want_y = sum(hw[j] * x[i, j] for j in range(4))
        assert torch.allclose(u[i], want_u, rtol=1e-12, atol=1e-12)
        assert torch.allclose(out[i], want_out, rtol=1e-12, atol=1e-12)
        assert torch.allclose(y[i], want_y, rtol=1e-12, atol=1e-12)


# ---- RoPE ----------------------------------------------------------------------------------------

def test_yarn_range_and_frequencies_of_released_config():
    cfg = ModelConfig.from_file(FIXTURES / "deepseek-v4-flash.config.json")
    rope = cfg.compress_rope
    assert yarn_correction_range(cfg.rope_dim, rope.theta, rope.yarn) == (15, 25)
    got = rope_frequencies(cfg.rope_dim, rope)
    want = ref_omega(cfg.rope_dim, rope.theta, rope.yarn)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=2e-6, atol=0)
    plain = ref_omega(cfg.rope_dim, rope.theta, None)
    assert torch.allclose(want[:16], plain[:16]) and torch.allclose(want[25:], plain[25:] / 16)
    assert ((want[16:25] < plain[16:25]) & (want[16:25] > plain[16:25] / 16)).all()
    # sliding layers and the MTP block: theta 10000, no YaRN; compressed layers: the YaRN table
    for spec in (cfg.layer(0), cfg.mtp_layer):
        assert spec.rope.yarn is None and spec.rope.theta == 10000
        assert torch.allclose(rope_frequencies(64, spec.rope).double(), ref_omega(64, 10000, None), rtol=2e-6)
    assert cfg.layer(2).rope == cfg.layer(3).rope == rope


def test_rope_layout_interleaved_trailing_and_inverse():
    g = torch.Generator().manual_seed(3)
    cfg = tiny_config("fp4")
    rope = RotaryEmbedding(16, cfg.compress_rope, F64)
    x = torch.randn(5, 3, 40, generator=g, dtype=F64)
    pos = torch.tensor([0, 1, 7, 1000, 65535])
    cos, sin = rope.cos_sin(pos)
    y = apply_rope(x, cos[:, None], sin[:, None])
    assert torch.allclose(rope.omega.double(), ref_omega(16, cfg.compress_rope.theta, cfg.compress_rope.yarn),
                          rtol=2e-6)
    omega = rope.omega.double()  # the fp32 table itself, so that angles agree to the last bit
    for i, p in enumerate(pos.tolist()):
        assert torch.allclose(y[i], ref_rope(x[i], p, omega), rtol=0, atol=1e-9)
    assert torch.equal(y[..., :24], x[..., :24])  # leading (nope) dims untouched
    assert torch.allclose(apply_rope(y, cos[:, None], -sin[:, None]), x, atol=1e-12)


# ---- one attention layer vs a per-token re-derivation -------------------------------------------

def ref_compressor_entries(comp, a, ratio, d, omega, numerics):
    """Entries of a compressor over tokens a[0:T], straight from §2.7."""
    c = a @ comp.wkv.weight.double().T
    z = a @ comp.wgate.weight.double().T + comp.ape.double()[torch.arange(a.shape[0]) % ratio]
    out = []
    for i in range(a.shape[0] // ratio):
        own = range(ratio * i, ratio * i + ratio)
        if ratio == 4:
            rows_c = [c[t, d:] for t in own] + ([c[t, :d] for t in range(4 * i - 4, 4 * i)] if i else [])
            rows_z = [z[t, d:] for t in own] + ([z[t, :d] for t in range(4 * i - 4, 4 * i)] if i else [])
        else:
            rows_c, rows_z = [c[t] for t in own], [z[t] for t in own]
        rc, rz = torch.stack(rows_c), torch.stack(rows_z)
        w = torch.exp(rz - rz.max(0).values)
        pooled = (w * rc).sum(0) / w.sum(0)
        e = ref_rope(ref_rms(pooled, comp.norm.weight), ratio * i, omega)
        if numerics == "reference" and comp.kind == "main":
            e = torch.cat((fake_quant_fp8(e[: d - omega.shape[0] * 2], 64), e[d - omega.shape[0] * 2:]))
        if numerics == "reference" and comp.kind == "index":
            e = fake_quant_fp4(e @ ref_hadamard(d), 32)
        out.append(e)
    return torch.stack(out) if out else torch.zeros(0, d, dtype=F64)


def ref_attention_layer(attn, cfg, spec, a, numerics):
    """Per-token float64 re-derivation of §2.3-2.8 for one layer; returns [T, D]."""
    ref = numerics == "reference"
    aq = lambda v: fake_quant_fp8(v, 128) if ref else v  # noqa: E731  activation quantisation
    t_len, h, dh, dr = a.shape[0], cfg.num_heads, cfg.head_dim, cfg.rope_dim
    dn, r, window = dh - dr, spec.compress_ratio, cfg.window
    omega = attn.rope.omega.double()  # checked against the spec formula in the YaRN test
    assert torch.allclose(omega, ref_omega(dr, spec.rope.theta, spec.rope.yarn), rtol=2e-6)
    w = lambda lin: lin.weight.double()  # noqa: E731
    qs, kvs, cqs = [], [], []
    for t in range(t_len):
        cq = ref_rms(w(attn.wq_a) @ aq(a[t]), attn.q_norm.weight)
        q = (w(attn.wq_b) @ aq(cq)).view(h, dh)
        q = torch.stack([ref_rope(ref_rms(q[i]), t, omega) for i in range(h)])
        kv = ref_rope(ref_rms(w(attn.wkv) @ aq(a[t]), attn.kv_norm.weight), t, omega)
        if ref:
            kv = torch.cat((fake_quant_fp8(kv[:dn], 64), kv[dn:]))
        qs.append(q), kvs.append(kv), cqs.append(cq)
    entries = ref_compressor_entries(attn.compressor, a, r, dh, omega, numerics) if r else None
    if r == 4:
        ix = attn.indexer
        keys = ref_compressor_entries(ix.compressor, a, 4, cfg.index_head_dim, omega, numerics)
    out = []
    for t in range(t_len):
        cand = [kvs[j] for j in range(max(0, t - window + 1), t + 1)]
        visible = (t + 1) // r if r else 0
        if r == 128:
            cand += [entries[j] for j in range(visible)]
        elif r == 4:
            qi = (w(ix.wq_b) @ aq(cqs[t])).view(cfg.index_n_heads, cfg.index_head_dim)
            qi = torch.stack([ref_rope(qi[i], t, omega) for i in range(qi.shape[0])])
            if ref:
                qi = fake_quant_fp4(qi @ ref_hadamard(cfg.index_head_dim), 32)
            hw = (w(ix.weights_proj) @ a[t]) / math.sqrt(cfg.index_head_dim) / math.sqrt(cfg.index_n_heads)
            score = [float((hw * torch.relu(qi @ keys[s])).sum()) for s in range(visible)]
            chosen = sorted(range(visible), key=lambda s: (-score[s], s))[: cfg.index_topk]
            cand += [entries[j] for j in chosen]
        v = torch.stack(cand)
        o = []
        for i in range(h):
            s = v @ qs[t][i] / math.sqrt(dh)
            m = s.max()
            p = torch.exp(s - m)
            oi = (p @ v) / (p.sum() + torch.exp(attn.attn_sink[i].double() - m))
            o.append(ref_rope(oi, -t, omega))
        o = torch.cat(o)
        per_group = o.numel() // cfg.o_groups
        wo_a = w(attn.wo_a)
        low = torch.cat([wo_a[g * cfg.o_lora_rank:(g + 1) * cfg.o_lora_rank] @ o[g * per_group:(g + 1) * per_group]
                         for g in range(cfg.o_groups)])
        out.append(w(attn.wo_b) @ aq(low))
    return torch.stack(out)


@pytest.mark.parametrize("kind,numerics,length", [
    ("sliding", "transformers", 40), ("csa", "transformers", 70), ("csa", "reference", 70),
    ("hca", "transformers", 300), ("hca", "reference", 260), ("sliding", "reference", 40)])
def test_attention_layer_matches_per_token_rederivation(kind, numerics, length):
    cfg = tiny_config("fp4", layers=kind, sliding_window=16)
    model = build(cfg, F64, numerics)
    attn, spec = model.layers[0].attn, cfg.layer(0)
    a = torch.randn(length, cfg.hidden_size, generator=torch.Generator().manual_seed(4), dtype=F64)
    state = SequenceState.create(cfg, F64).layers[0]
    split = [length // 3, 1, length - length // 3 - 1]  # chunked, so the state path is exercised too
    outs, start = [], 0
    for n in split:
        outs.append(attn(a[start:start + n], torch.arange(start, start + n), [Segment(0, n, state)]))
        start += n
    got = torch.cat(outs)
    want = ref_attention_layer(attn, cfg, spec, a, numerics)
    assert rel(got, want) < 1e-10
    if kind == "csa":  # the indexer really selected (fewer than all visible entries for late queries)
        assert length // 4 > cfg.index_topk


def test_indexer_ties_go_to_lowest_index():
    scores = torch.tensor([[0.0, 2.0, 0.0, 2.0, 0.0, 1.0, 0.0]])
    assert top_k_lowest_index(scores, 4).tolist() == [[1, 3, 5, 0]]
    assert top_k_lowest_index(torch.zeros(1, 9), 3).tolist() == [[0, 1, 2]]


def test_compressed_entries_invisible_before_their_last_token():
    """Changing token t's input may only change outputs of queries >= t (causality, incl. entries)."""
    cfg = tiny_config("fp4", layers="csa,hca", sliding_window=16)
    model = build(cfg, F64, "transformers")
    ids = torch.randint(0, cfg.vocab_size, (140,), generator=torch.Generator().manual_seed(5))
    base = model(ids, torch.arange(140))
    for t in (3, 127, 131):
        changed = ids.clone()
        changed[t] = (changed[t] + 1) % cfg.vocab_size
        out = model(changed, torch.arange(140))
        # (not bit-equal: the changed token regroups the MoE batches, a 1e-16 effect in float64)
        assert rel(out[:t], base[:t]) < 1e-12
        assert rel(out[t:t + 1], base[t:t + 1]) > 1e-3


# ---- MoE -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("numerics", ["transformers", "reference"])
def test_moe_matches_rederivation(numerics):
    cfg = tiny_config("fp4", layers="sliding,sliding")  # layer 0 hash-routed, layer 1 top-k
    model = build(cfg, F64, numerics)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(24, cfg.hidden_size, generator=g, dtype=F64) * 6  # large enough to hit the clamps
    ids = torch.randint(0, cfg.vocab_size, (24,), generator=g)
    aq = (lambda v: fake_quant_fp8(v, 128)) if numerics == "reference" else (lambda v: v)
    clamp_hit = False
    for layer in model.layers:
        ffn = layer.ffn
        got = ffn(x, ids)

        def expert(e, v, weight):
            nonlocal clamp_hit
            g1, u3 = e.w1.weight.double() @ aq(v), e.w3.weight.double() @ aq(v)
            clamp_hit |= bool((g1 > 10).any() and (u3.abs() > 10).any())
            z = weight * torch.nn.functional.silu(g1.clamp(max=10)) * u3.clamp(-10, 10)
            return e.w2.weight.double() @ aq(z)

        for t in range(x.shape[0]):
            logits = ffn.gate.weight.double() @ x[t]
            s = torch.sqrt(torch.log1p(torch.exp(logits)))
            if layer.spec.moe == "hash":
                chosen = ffn.gate.tid2eid[ids[t]].tolist()
            else:
                biased = (s + ffn.gate.bias.double()).tolist()
                chosen = sorted(range(len(biased)), key=lambda e: (-biased[e], e))[: cfg.num_experts_per_tok]
            wsum = sum(s[e] for e in chosen)
            want = sum(expert(ffn.experts[e], x[t], s[e] / wsum * cfg.routed_scaling_factor) for e in chosen)
            want = want + expert(ffn.shared_experts, x[t], 1.0)
            assert torch.allclose(got[t], want, rtol=1e-10, atol=1e-10)
    assert clamp_hit
