"""Independent float64 re-derivation of the DeepSeek-V4 forward pass (test helper only).

Written from the spec (deepseek_v4_model.md §2, checkpoint_format.md §5-§8), not from dsv4's code:
it reads an official-format checkpoint with its own decoder and evaluates every equation in float64.
It is slow and only meant for tiny models. `Sim` switches the reference numerics of §2.6 / §7 on:
FP8 KV simulation, indexer Hadamard + FP4 simulation, FP8 activation quantisation.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

f64 = torch.float64
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass(frozen=True)
class Sim:
    """Which reference quantisation simulations are on (all off = exact math)."""
    kv: bool = False        # FP8 e4m3, block 64, pow2 scales on kv[0:nope]
    indexer: bool = False   # Hadamard(128) + FP4 e2m1, block 32, pow2 scales on indexer q / keys
    act: bool = False       # FP8 activation quantisation per token per 128 before FP8/FP4 GEMMs


EXACT = Sim()
REFERENCE = Sim(kv=True, indexer=True, act=True)


# ---- checkpoint reading (own decoder, checkpoint_format.md §5-§6) ------------------------------

def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return torch.exp2(scale.view(torch.uint8).to(f64) - 127.0)  # byte 0 -> 2^-127 exactly
    return scale.to(f64)


def _dequantize(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = _scale_values(scale)
    if w.dtype == torch.int8:  # MXFP4: low nibble = even element; one scale per 32 inputs
        u = w.view(torch.uint8).long()
        lut = torch.tensor(E2M1_VALUES, dtype=f64)
        v = torch.stack([lut[u & 0xF], lut[u >> 4]], dim=-1).reshape(w.shape[0], -1)
        return v * s.repeat_interleave(32, dim=1)
    v = w.to(f64)  # e4m3 -> float is exact
    s = s.repeat_interleave(128, 0)[: v.shape[0]].repeat_interleave(128, 1)[:, : v.shape[1]]
    return v * s


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], set[str]]:
    """(config.json dict, official name -> float64 logical tensor, names of FP8/FP4-quantised linears)."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                raw[k] = fh.get_tensor(k)
    weights, quantized = {}, set()
    for k, t in raw.items():
        if k.endswith(".scale"):
            continue
        sk = k[: -len(".weight")] + ".scale" if k.endswith(".weight") else None
        if sk in raw:
            weights[k] = _dequantize(t, raw[sk])
            quantized.add(k)
        else:
            weights[k] = t if t.dtype == torch.int64 else t.to(f64)
    return cfg, weights, quantized


# ---- quantisation simulations (§2.6, checkpoint_format.md §7-§8) -------------------------------

def pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= v (v > 0)."""
    m, e = torch.frexp(v)
    return torch.where(m == 0.5, torch.ldexp(torch.ones_like(v), e - 1), torch.ldexp(torch.ones_like(v), e))


def _round_float(x: torch.Tensor, mant_bits: int, min_exp: int, max_val: float) -> torch.Tensor:
    """Round-to-nearest-even onto a small float grid (subnormals below 2^min_exp), |x| <= max_val."""
    x = x.clamp(-max_val, max_val)
    e = (torch.frexp(x)[1] - 1).clamp_min(min_exp)  # exact floor(log2|x|) for x != 0
    quantum = torch.ldexp(torch.ones_like(x), e - mant_bits)
    return torch.round(x / quantum) * quantum  # torch.round is half-to-even


def e4m3_rne(x: torch.Tensor) -> torch.Tensor:
    return _round_float(x, 3, -6, 448.0)


def e2m1_rne(x: torch.Tensor) -> torch.Tensor:
    return _round_float(x, 1, 0, 6.0)


def fake_quant(x: torch.Tensor, block: int, fmt: str) -> torch.Tensor:
    """Quantise-dequantise along the last dim in blocks, pow2 scale = pow2_ceil(fp32(amax * fp32(1/qmax)))."""
    qmax, floor, rne = (448.0, 1e-4, e4m3_rne) if fmt == "fp8" else (6.0, 6.0 * 2.0 ** -126, e2m1_rne)
    shape = x.shape
    xb = x.reshape(*shape[:-1], shape[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(floor)
    prod = amax.to(torch.float32) * torch.tensor(1.0 / qmax, dtype=torch.float32)  # fp32 multiply, as in [R]
    s = pow2_ceil(prod).to(x.dtype)
    return (rne(xb / s) * s).reshape(shape)


def hadamard(n: int) -> torch.Tensor:
    """Normalised Sylvester-Hadamard matrix: H[i, j] = (-1)^popcount(i & j) / sqrt(n)."""
    i = torch.arange(n)
    bits = torch.bitwise_and(i[:, None], i[None, :])
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return (1.0 - 2.0 * parity.to(f64)) / math.sqrt(n)


# ---- building blocks -----------------------------------------------------------------------

def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope_freqs(c: dict, compressed: bool) -> torch.Tensor:
    """ω_i per pair (§2.4.2) as an fp32 table. The table is a convention of the trained model, so it
    is evaluated in fp32 in the order of DeepSeek's reference (`1 / base^(2i/d)`, then the YaRN blend
    `ω/s·(1-keep) + ω·keep` with keep = 1 - ramp); a correctly rounded table differs in the last bit,
    which moves logits by ~1e-6 and would hide FP8-rounding flips in float64 comparisons."""
    rd = c["qk_rope_head_dim"]
    base = float(c["compress_rope_theta"] if compressed else c["rope_theta"])
    w = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    ys = c.get("rope_scaling")
    if compressed and ys:
        s, l0 = ys["factor"], ys["original_max_position_embeddings"]
        cdim = lambda n: rd * math.log(l0 / (2 * math.pi * n)) / (2 * math.log(base))  # noqa: E731
        lo, hi = max(math.floor(cdim(ys["beta_fast"])), 0), min(math.ceil(cdim(ys["beta_slow"])), rd - 1)
        ramp = ((torch.arange(rd // 2, dtype=torch.float32) - lo) / ((hi + 0.001 if hi == lo else hi) - lo)).clamp(0, 1)
        keep = 1 - ramp
        w = w / s * (1 - keep) + w * keep
    return w


def rope(x: torch.Tensor, pos: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Interleaved-pair RoPE on the last 2*len(freqs) dims; x [T, ..., d], pos [T]."""
    rd = 2 * freqs.numel()
    ang = (pos.to(torch.float32)[:, None] * freqs[None, :]).to(x.dtype)  # fp32 angle table (§2.4.1)
    ang = -ang if inverse else ang
    shape = (ang.shape[0],) + (1,) * (x.dim() - 2) + (ang.shape[1],)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    xe, xo = x[..., -rd::2], x[..., -rd + 1 :: 2]
    rot = torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], dim=-1).flatten(-2)
    return torch.cat([x[..., :-rd], rot], dim=-1)


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest per row; exact ties go to the lower index (the reference leaves
    tie-breaking unspecified; FP4-simulated index scores can tie, e.g. at 0 after the ReLU)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


class Ref:
    """Float64 DeepSeek-V4 (backbone + MTP) over one sequence starting at position 0."""

    def __init__(self, path: str | Path, sim: Sim = EXACT, dtype: torch.dtype = f64):
        self.cfg, w, self.quantized = read_checkpoint(path)
        # dtype=float32 gives the same equations in fp32: its distance to float64 measures how much
        # plain rounding noise (incl. flipped FP8/FP4 rounding decisions) an fp32 implementation shows.
        self.w = {k: v if v.dtype == torch.int64 else v.to(dtype) for k, v in w.items()}
        self.sim, self.dtype = sim, dtype
        c = self.cfg
        self.eps, self.hc, self.L = c["rms_norm_eps"], c["hc_mult"], c["num_hidden_layers"]
        ratios = list(c["compress_ratios"])
        self.ratios = ratios + [0] * (self.L + 1 - len(ratios))
        self.H = hadamard(c["index_head_dim"]).to(dtype)

    def lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self.w[name + ".weight"]
        if self.sim.act and name + ".weight" in self.quantized and not name.endswith("wo_a"):
            x = fake_quant(x, 128, "fp8")
        return x @ w.T

    # -- mHC (§2.2) and HC head (§2.10)
    def hc_pre(self, X: torch.Tensor, p: str):
        c, hc = self.cfg, self.hc
        fn, base, scale = self.w[p + "_fn"], self.w[p + "_base"], self.w[p + "_scale"]
        flat = X.reshape(X.shape[0], -1)
        m = (flat @ fn.T) / torch.sqrt(flat.square().mean(-1, keepdim=True) + self.eps)
        pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + c["hc_eps"]
        post = 2 * torch.sigmoid(m[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
        A = (m[:, 2 * hc :] * scale[2] + base[2 * hc :]).view(-1, hc, hc)
        C = torch.softmax(A, dim=-1) + c["hc_eps"]
        C = C / (C.sum(-2, keepdim=True) + c["hc_eps"])
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            C = C / (C.sum(-1, keepdim=True) + c["hc_eps"])
            C = C / (C.sum(-2, keepdim=True) + c["hc_eps"])
        u = (pre[:, :, None] * X).sum(1)
        return u, post, C

    @staticmethod
    def hc_post(X, f, post, C):
        return post[:, :, None] * f[:, None, :] + torch.einsum("tjk,tjd->tkd", C, X)

    def hc_head(self, X: torch.Tensor, prefix: str = "") -> torch.Tensor:
        fn, base, scale = (self.w[prefix + "hc_head_" + k] for k in ("fn", "base", "scale"))
        flat = X.reshape(X.shape[0], -1)
        m = (flat @ fn.T) / torch.sqrt(flat.square().mean(-1, keepdim=True) + self.eps)
        wj = torch.sigmoid(m * scale + base) + self.cfg["hc_eps"]
        return (wj[:, :, None] * X).sum(1)

    # -- compressor (§2.7): entries [T // r, d], already normalised, rotated and simulated
    def compress(self, a, p: str, r: int, d: int, freqs, kind: str) -> torch.Tensor:
        T = a.shape[0]
        n = T // r
        Cm = a @ self.w[p + "wkv.weight"].T
        Z = a @ self.w[p + "wgate.weight"].T + self.w[p + "ape"][torch.arange(T) % r]
        entries = []
        for i in range(n):
            if r == 4:
                rows_c, rows_z = [Cm[4 * i : 4 * i + 4, d:]], [Z[4 * i : 4 * i + 4, d:]]
                if i > 0:  # previous window's A halves; entry 0 has none (weight 0)
                    rows_c.insert(0, Cm[4 * i - 4 : 4 * i, :d])
                    rows_z.insert(0, Z[4 * i - 4 : 4 * i, :d])
                c_rows, z_rows = torch.cat(rows_c), torch.cat(rows_z)
            else:
                c_rows, z_rows = Cm[r * i : r * i + r], Z[r * i : r * i + r]
            entries.append((torch.softmax(z_rows, dim=0) * c_rows).sum(0))
        if n == 0:
            return a.new_zeros(0, d)
        e = rms(torch.stack(entries), self.w[p + "norm.weight"], self.eps)
        e = rope(e, torch.arange(n) * r, freqs)
        return self.finish(e, kind)

    def finish(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        """Post-RoPE simulation of a kv vector ("kv") or an indexer q / key ("indexer")."""
        if kind == "kv" and self.sim.kv:
            nope = self.cfg["head_dim"] - self.cfg["qk_rope_head_dim"]
            return torch.cat([fake_quant(x[..., :nope], 64, "fp8"), x[..., nope:]], dim=-1)
        if kind == "indexer" and self.sim.indexer:
            return fake_quant(x @ self.H, 32, "fp4")  # H is symmetric: x @ H == H x
        return x

    # -- attention (§2.3-§2.8)
    def attention(self, a, p: str, ratio: int, pos: torch.Tensor):
        c, eps = self.cfg, self.eps
        T, H, Dh = a.shape[0], c["num_attention_heads"], c["head_dim"]
        freqs = rope_freqs(c, compressed=ratio > 0)
        cq = rms(self.lin(a, p + "wq_a"), self.w[p + "q_norm.weight"], eps)
        q = rms(self.lin(cq, p + "wq_b").view(T, H, Dh), None, eps)
        q = rope(q, pos, freqs)
        kv = rope(rms(self.lin(a, p + "wkv"), self.w[p + "kv_norm.weight"], eps), pos, freqs)
        kv = self.finish(kv, "kv")
        t, j = pos[:, None], pos[None, :]
        keys, visible = [kv], [(j <= t) & (j > t - c["sliding_window"])]
        if ratio:
            ent = self.compress(a, p + "compressor.", ratio, Dh, freqs, "kv")
            vis = torch.arange(ent.shape[0])[None, :] < (t + 1) // ratio
            if ratio == 4:
                vis = vis & self.indexer_select(a, cq, p + "indexer.", pos, freqs)
            keys.append(ent)
            visible.append(vis)
        K, vis = torch.cat(keys), torch.cat(visible, dim=1)
        s = torch.einsum("thd,jd->thj", q, K) * Dh**-0.5
        s = s.masked_fill(~vis[:, None, :], float("-inf"))
        sink = self.w[p + "attn_sink"][None, :, None]
        mx = torch.maximum(s.amax(-1, keepdim=True), sink)
        e = torch.exp(s - mx)
        o = torch.einsum("thj,jd->thd", e, K) / (e.sum(-1, keepdim=True) + torch.exp(sink - mx))
        o = rope(o, pos, freqs, inverse=True)
        G = c["o_groups"]
        wo_a = self.w[p + "wo_a.weight"].view(G, c["o_lora_rank"], -1)
        r = torch.einsum("tgi,goi->tgo", o.reshape(T, G, -1), wo_a).reshape(T, -1)
        return self.lin(r, p + "wo_b")

    def index_scores(self, a, cq, p: str, pos: torch.Tensor, freqs) -> torch.Tensor:
        """I[t, s] of §2.8 over all complete entries (masked to -inf where not visible)."""
        c = self.cfg
        T, nh, hd = a.shape[0], c["index_n_heads"], c["index_head_dim"]
        qI = self.finish(rope(self.lin(cq, p + "wq_b").view(T, nh, hd), pos, freqs), "indexer")
        w = (a @ self.w[p + "weights_proj.weight"].T) * hd**-0.5 * nh**-0.5
        K = self.compress(a, p + "compressor.", 4, hd, freqs, "indexer")
        scores = torch.einsum("th,ths->ts", w, torch.relu(torch.einsum("thd,sd->ths", qI, K)))
        vis = torch.arange(K.shape[0])[None, :] < (pos[:, None] + 1) // 4
        return scores.masked_fill(~vis, float("-inf"))

    def indexer_select(self, a, cq, p, pos, freqs) -> torch.Tensor:
        scores = self.index_scores(a, cq, p, pos, freqs)
        k = min(self.cfg["index_topk"], scores.shape[1])
        sel = torch.zeros_like(scores, dtype=torch.bool)
        if k:
            sel.scatter_(1, top_k(scores, k), True)
        return sel & torch.isfinite(scores)

    # -- MoE (§2.9)
    def swiglu(self, x, p: str, weight) -> torch.Tensor:
        lim = self.cfg["swiglu_limit"]
        g = self.lin(x, p + "w1").clamp(max=lim)
        u = self.lin(x, p + "w3").clamp(-lim, lim)
        return self.lin(weight * F.silu(g) * u, p + "w2")

    def moe(self, x, p: str, ids, hashed: bool) -> torch.Tensor:
        c = self.cfg
        scores = torch.sqrt(F.softplus(x @ self.w[p + "gate.weight"].T))
        if hashed:
            S = self.w[p + "gate.tid2eid"][ids].long()
        else:
            S = top_k(scores + self.w[p + "gate.bias"], c["num_experts_per_tok"])
        wts = scores.gather(1, S)
        wts = wts / wts.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        y = self.swiglu(x, p + "shared_experts.", 1.0) if c.get("n_shared_experts", 1) else torch.zeros_like(x)
        for e in S.unique().tolist():
            tok, slot = (S == e).nonzero(as_tuple=True)
            y = y.index_add(0, tok, self.swiglu(x[tok], f"{p}experts.{e}.", wts[tok, slot][:, None]))
        return y

    # -- block, model, MTP
    def block(self, X, p: str, ratio: int, hashed: bool, ids, pos) -> torch.Tensor:
        u, post, C = self.hc_pre(X, p + "hc_attn")
        f = self.attention(rms(u, self.w[p + "attn_norm.weight"], self.eps), p + "attn.", ratio, pos)
        X = self.hc_post(X, f, post, C)
        u, post, C = self.hc_pre(X, p + "hc_ffn")
        f = self.moe(rms(u, self.w[p + "ffn_norm.weight"], self.eps), p + "ffn.", ids, hashed)
        return self.hc_post(X, f, post, C)

    def logits(self, y: torch.Tensor, norm: str) -> torch.Tensor:
        return rms(y, self.w[norm], self.eps) @ self.w["head.weight"].T

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, layers: int | None = None) -> dict[str, torch.Tensor]:
        """logits [T, V] and the pre-hc_head residual [T, hc, D] (after `layers` blocks if given)."""
        ids = ids.long()
        pos = torch.arange(ids.numel())
        X = self.w["embed.weight"][ids][:, None, :].expand(-1, self.hc, -1)
        n_hash = self.cfg.get("num_hash_layers", 3)
        for layer in range(self.L if layers is None else layers):
            X = self.block(X, f"layers.{layer}.", self.ratios[layer], layer < n_hash, ids, pos)
        return {"logits": self.logits(self.hc_head(X), "norm.weight"), "residual": X}

    @torch.no_grad()
    def mtp(self, residual: torch.Tensor, next_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """MTP block (§2.11): residual = main model's Xᴸ [T, hc, D]; next_ids = tokens t+1."""
        p = "mtp.0."
        pos = torch.arange(next_ids.numel())
        e = self.lin(rms(self.w["embed.weight"][next_ids.long()], self.w[p + "enorm.weight"], self.eps), p + "e_proj")
        hs = self.lin(rms(residual, self.w[p + "hnorm.weight"], self.eps), p + "h_proj")
        X = self.block(hs + e[:, None, :], p, self.ratios[self.L], False, next_ids, pos)
        return {"logits": self.logits(self.hc_head(X, p), p + "norm.weight"), "residual": X}
