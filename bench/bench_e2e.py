"""End-to-end decode benchmark of a Flash-shaped layer stack with random weights made on the GPU.

Layers: one of each kind (SWA, CSA, HCA) at full Flash width + HC head + LM head. Per decode step and
layer: mHC pre/post (Triton, post fused with the next pre), q/kv projections (FP8 kernels of #5 when
they import and pass a self-check, else bf16 F.linear — printed), q/kv norms + RoPE + FP8 ring insert
(torch ops), compressor and lightning indexer (torch ops, branch-free: the open window is pooled every
step and written to its entry slot, which only becomes visible once complete), decode attention over
the paged FP8 cache (Triton), grouped wo_a (bf16 bmm, as the reference), wo_b, router + fused MoE
(MXFP4 experts, kernel of #5; left out and said so if it fails) + shared expert.

Reports per (batch, context): ms per step for the stack (CUDA graph replay), per layer kind, the
extrapolation to 43 layers (2 SWA + 21 CSA + 20 HCA + head), the memory roofline (bytes one step must
read / measured copy bandwidth), and kernel launches per step (profiler, eager). `--tiny` runs a
small-shape smoke test (CPU with TRITON_INTERPRET=1 works).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsv4.config import Rope, Yarn  # noqa: E402
from dsv4.kernels.attention import decode_attention  # noqa: E402
from dsv4.kernels.mhc import hc_head, hc_post, hc_post_pre, hc_pre, prepare_mix  # noqa: E402
from dsv4.model.numerics import hadamard_matrix  # noqa: E402
from dsv4.model.rope import RotaryEmbedding  # noqa: E402

FLASH = dict(D=4096, H=64, HD=512, NOPE=448, RQ=1024, G=8, RO=1024, W=128, IH=64, IHD=128, TOPK=512, E=256,
             I=2048, K=6, V=129280)
TINY = dict(D=256, H=16, HD=512, NOPE=448, RQ=128, G=2, RO=128, W=128, IH=4, IHD=128, TOPK=16, E=8, I=256, K=2,
            V=1000)
EPS = 1e-6
RING = 132  # window + max_rollback
PS = {"window": 16, 4: 64, 128: 16}
HC_KW = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=EPS)


# --------------------------------------------------------------------------- linears with fallbacks

class Linears:
    """FP8 block linear through #5's kernel when it works here, else bf16 (dequantised) F.linear."""

    def __init__(self, dev):
        self.fp8 = False
        self.note = "bf16 F.linear (FP8 kernel unavailable)"
        try:
            from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref
            x = torch.randn(3, 512, device=dev).to(torch.bfloat16)
            w, s = self.make_fp8(256, 512, dev)
            err = (fp8_linear(x, w, s).float() - fp8_linear_ref(x, w, s).float()).norm() / \
                fp8_linear_ref(x, w, s).float().norm()
            if float(err) < 1e-2:
                self.fp8, self._f = True, fp8_linear
                self.note = "FP8 block linear (#5 kernel)"
            else:
                self.note += f" (self-check error {float(err):.1e})"
        except Exception as e:  # noqa: BLE001 - report and fall back
            self.note += f" ({type(e).__name__}: {str(e)[:80]})"

    @staticmethod
    def make_fp8(n, k, dev):
        w = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
        s = torch.randint(112, 120, (n // 128, k // 128), device=dev, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        return w, s

    def weight(self, n, k, dev):
        if self.fp8:
            return ("fp8",) + self.make_fp8(n, k, dev)
        return ("bf16", (torch.randn(n, k, device=dev) * k ** -0.5).to(torch.bfloat16))

    def __call__(self, x, w):
        if w[0] == "fp8":
            return self._f(x, w[1], w[2])
        return F.linear(x, w[1])


def nbytes(w) -> int:
    return sum(t.numel() * t.element_size() for t in w[1:]) if isinstance(w, tuple) else w.numel() * w.element_size()


# --------------------------------------------------------------------------- torch pieces of a step

def rms(x, w):
    xf = x.float()
    return (w.float() * xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rope(x, cos, sin):
    """Interleaved-pair RoPE on the trailing 2*cos.shape[-1] dims (fp32 math)."""
    r = 2 * cos.shape[-1]
    pairs = x[..., -r:].float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)
    return torch.cat((x[..., :-r], rot), -1)


def fp8_split(x, nope):
    """nope dims -> (e4m3, E8M0 bytes per 64), rope dims bf16 (pow2 scales, as the engine stores them)."""
    xb = x[..., :nope].float().unflatten(-1, (-1, 64))
    e = torch.ceil(torch.log2(xb.abs().amax(-1).clamp_min(1e-4) / 448.0))
    q = (xb / torch.exp2(e).unsqueeze(-1)).clamp(-448, 448).flatten(-2).to(torch.float8_e4m3fn)
    return q, (e + 127).to(torch.uint8), x[..., nope:].to(torch.bfloat16)


class Pool:
    def __init__(self, pages, ps, c, dev):
        self.q = (torch.randn(pages, ps, c["NOPE"], device=dev)).to(torch.float8_e4m3fn)
        self.s = torch.randint(122, 127, (pages, ps, c["NOPE"] // 64), device=dev, dtype=torch.uint8)
        self.rope = torch.randn(pages, ps, c["HD"] - c["NOPE"], device=dev).to(torch.bfloat16)

    def write(self, table, index, ps, x, nope):
        b = torch.arange(x.shape[0], device=x.device)
        page, off = table[b, index // ps].long(), index % ps
        q, s, r = fp8_split(x, nope)
        self.q[page, off], self.s[page, off], self.rope[page, off] = q, s, r


class Layer:
    def __init__(self, kind: str, c: dict, lin: Linears, bsz: int, ctx: int, dev, with_moe: bool):
        self.kind, self.c, self.lin, self.bsz = kind, c, lin, bsz
        self.ratio = {"swa": 0, "csa": 4, "hca": 128}[kind]
        D, H, HD = c["D"], c["H"], c["HD"]
        bf = dict(device=dev, dtype=torch.bfloat16)
        self.hc = {s: (prepare_mix(torch.randn(24, 4 * D, device=dev) * (2 / (4 * D) ** 0.5)),
                       torch.randn(24, device=dev) * 0.5, torch.rand(3, device=dev) + 0.5) for s in ("attn", "ffn")}
        self.attn_norm, self.ffn_norm = torch.rand(D, **bf) + 0.5, torch.rand(D, **bf) + 0.5
        self.wq_a, self.wq_b = lin.weight(c["RQ"], D, dev), lin.weight(H * HD, c["RQ"], dev)
        self.wkv, self.wo_b = lin.weight(HD, D, dev), lin.weight(D, c["G"] * c["RO"], dev)
        self.q_norm, self.kv_norm = torch.rand(c["RQ"], **bf) + 0.5, torch.rand(HD, **bf) + 0.5
        self.wo_a = torch.randn(c["G"], c["RO"], H * HD // c["G"], **bf) * 0.02
        self.sink = torch.randn(H, device=dev)
        self.rope_t = RotaryEmbedding(HD - c["NOPE"], Rope(10000.0, None) if not self.ratio else
                                      Rope(160000.0, Yarn(16, 65536, 32, 1)))
        self.cos, self.sin = (t.to(dev) for t in self.rope_t.cos_sin(torch.arange(ctx + 8)))
        # paged window ring + compressed entries, shuffled page tables
        wp = -(-RING // PS["window"])
        self.wpool = Pool(bsz * wp, PS["window"], c, dev)
        self.wtab = torch.randperm(bsz * wp, device=dev).view(bsz, wp).int()
        self.weights = [self.wq_a, self.wq_b, self.wkv, self.wo_b]
        if self.ratio:
            r = self.ratio
            n_ent = ctx // r + 2
            cp = -(-n_ent // PS[r])
            self.cpool = Pool(bsz * cp, PS[r], c, dev)
            self.ctab = torch.randperm(bsz * cp, device=dev).view(bsz, cp).int()
            self.comp = self._compressor(HD, r, dev)
            self.weights_bf16 = [self.comp["w"]]
        if kind == "csa":
            self.iwq_b = lin.weight(c["IH"] * c["IHD"], c["RQ"], dev)
            self.weights.append(self.iwq_b)
            self.iw_proj = torch.randn(c["IH"], D, **bf) * D ** -0.5
            self.icomp = self._compressor(c["IHD"], 4, dev)
            self.ikeys = torch.randn(bsz, ctx // 4 + 2, c["IHD"], **bf)
            self.hadamard = hadamard_matrix(c["IHD"]).to(**bf)
            self.weights_bf16 += [self.iw_proj, self.icomp["w"]]
        # MoE: router, shared expert (FP8), routed MXFP4 experts in #5's packed layout
        self.gate = torch.randn(c["E"], D, **bf) * D ** -0.5
        self.gate_bias = torch.randn(c["E"], device=dev) * 0.01
        self.sh13, self.sh2 = lin.weight(2 * c["I"], D, dev), lin.weight(D, c["I"], dev)
        self.weights += [self.sh13, self.sh2]
        self.experts = None
        if with_moe:
            from dsv4.kernels.moe import PackedExperts
            E, I = c["E"], c["I"]
            u8 = dict(device=dev, dtype=torch.uint8)
            self.experts = PackedExperts(
                "mxfp4", E, D, I, torch.randint(0, 256, (E, 2 * I, D // 2), **u8),
                # group scales packed 4 per int32 along K: [E, N, K/128] (the #5 kernel's layout)
                torch.randint(118, 124, (E, 2 * I, D // 128, 4), **u8).view(torch.int32).view(E, 2 * I, D // 128),
                torch.randint(0, 256, (E, D, I // 2), **u8),
                torch.randint(118, 124, (E, D, I // 128, 4), **u8).view(torch.int32).view(E, D, I // 128),
                wide_ok=True)  # scale bytes <= 128

    def _compressor(self, d, r, dev):
        c2 = 2 if r == 4 else 1
        cap = 8 if r == 4 else 128
        D = self.c["D"]
        return dict(d=d, r=r, c2=c2, cap=cap,
                    w=torch.randn(2 * c2 * d, D, device=dev, dtype=torch.bfloat16) * D ** -0.5,
                    ape=torch.randn(r, c2 * d, device=dev) * 0.1,
                    norm=torch.rand(d, device=dev, dtype=torch.bfloat16) + 0.5,
                    C=torch.randn(self.bsz, cap, c2 * d, device=dev),
                    Z=torch.randn(self.bsz, cap, c2 * d, device=dev))

    def compress(self, comp, a, pos):
        """Append this token's rows; pool the open window (complete or not) -> entry pos // r."""
        d, r, c2, cap = comp["d"], comp["r"], comp["c2"], comp["cap"]
        b = torch.arange(a.shape[0], device=a.device)
        cz = F.linear(a, comp["w"]).float()
        cc, zz = cz[:, : c2 * d], cz[:, c2 * d:] + comp["ape"][pos % r]
        comp["C"][b, pos % cap], comp["Z"][b, pos % cap] = cc, zz
        i = pos // r
        own = i[:, None] * r + torch.arange(r, device=a.device)[None, :]  # [B, r]
        C_own, Z_own = comp["C"][b[:, None], own % cap], comp["Z"][b[:, None], own % cap]
        Z_own = Z_own.masked_fill((own > pos[:, None])[..., None], float("-inf"))
        if c2 == 2:
            prev = own - r
            C_p = comp["C"][b[:, None], prev % cap][..., :d]
            Z_p = comp["Z"][b[:, None], prev % cap][..., :d].masked_fill((prev < 0)[..., None], float("-inf"))
            C_all, Z_all = torch.cat((C_p, C_own[..., d:]), 1), torch.cat((Z_p, Z_own[..., d:]), 1)
        else:
            C_all, Z_all = C_own, Z_own
        pooled = (torch.softmax(Z_all, 1) * C_all).sum(1).to(torch.bfloat16)
        e = rope(rms(pooled, comp["norm"]), self.cos[i * r], self.sin[i * r])
        return e, i

    def step(self, a, pos):
        """a: attention input [B, D] (normed) -> attention output [B, D]."""
        c, lin = self.c, self.lin
        B, H, HD, NOPE = a.shape[0], c["H"], c["HD"], c["NOPE"]
        cos, sin = self.cos[pos], self.sin[pos]
        cq = rms(lin(a, self.wq_a), self.q_norm)
        q = lin(cq, self.wq_b).view(B, H, HD)
        q = rope(q * torch.rsqrt(q.square().mean(-1, keepdim=True) + EPS), cos[:, None], sin[:, None])
        kv = rope(rms(lin(a, self.wkv), self.kv_norm), cos, sin)
        self.wpool.write(self.wtab, pos % RING, PS["window"], kv, NOPE)
        idx = cnt = None
        if self.ratio:
            e, i = self.compress(self.comp, a, pos)
            self.cpool.write(self.ctab, i, PS[self.ratio], e, NOPE)
            cnt = (pos + 1) // self.ratio
        if self.kind == "csa":
            k_e, k_i = self.compress(self.icomp, a, pos)
            self.ikeys[torch.arange(B, device=a.device), k_i] = k_e @ self.hadamard
            iq = rope(lin(cq, self.iwq_b).view(B, c["IH"], c["IHD"]), cos[:, None], sin[:, None]) @ self.hadamard
            w = F.linear(a, self.iw_proj) * (c["IHD"] ** -0.5 * c["IH"] ** -0.5)
            sc = torch.relu(torch.einsum("bhd,bnd->bhn", iq, self.ikeys))
            sc = (sc * w[..., None]).sum(1).float()
            n = torch.arange(sc.shape[1], device=a.device)
            sc = sc.masked_fill(n[None, :] >= cnt[:, None], float("-inf"))
            top = torch.topk(sc, min(c["TOPK"], sc.shape[1]), dim=1)
            idx = torch.where(torch.isfinite(top.values), top.indices, -1).int()
        o = decode_attention(q, pos, cos, sin, self.wpool, self.wtab, RING, c["W"],
                             self.cpool if self.ratio else None, self.ctab if self.ratio else None,
                             idx, cnt if self.kind == "hca" else None, self.sink, HD ** -0.5)
        o = o.view(B, c["G"], -1).transpose(0, 1)
        low = torch.bmm(o, self.wo_a.transpose(1, 2)).transpose(0, 1).reshape(B, -1)
        return lin(low, self.wo_b)

    def moe(self, x):
        c = self.c
        scores = torch.sqrt(F.softplus(F.linear(x.float(), self.gate.float())))
        ids = torch.topk(scores + self.gate_bias, c["K"], dim=1).indices
        wts = scores.gather(1, ids)
        wts = wts / wts.sum(1, keepdim=True) * 1.5
        gu = self.lin(x, self.sh13).float()
        g, u = gu[:, : c["I"]].clamp(max=10), gu[:, c["I"]:].clamp(-10, 10)
        shared = self.lin((F.silu(g) * u).to(torch.bfloat16), self.sh2)
        if self.experts is None:
            return shared
        from dsv4.kernels.moe import fused_moe
        return fused_moe(x, ids.int(), wts, self.experts, shared=shared)


class Model:
    def __init__(self, c, kinds, bsz, ctx, dev, lin, with_moe):
        self.c = c
        self.layers = [Layer(k, c, lin, bsz, ctx, dev, with_moe) for k in kinds]
        D = c["D"]
        self.embed = torch.randn(c["V"], D, device=dev, dtype=torch.bfloat16)
        self.head = torch.randn(c["V"], D, device=dev, dtype=torch.bfloat16) * D ** -0.5
        self.head_fn = prepare_mix(torch.randn(4, 4 * D, device=dev) * (2 / (4 * D) ** 0.5))
        self.head_base, self.head_scale = torch.randn(4, device=dev) * 0.5, torch.rand(1, device=dev) + 0.5
        self.norm = torch.rand(D, device=dev, dtype=torch.bfloat16) + 0.5

    def layer_step(self, layer, x, pos, pre=None):
        """One block; `pre` = (normed attn input, post, comb) if already computed by a fused post+pre."""
        fn, base, scale = layer.hc["attn"]
        a, post, comb = pre if pre is not None else hc_pre(x, fn, base, scale, norm_weight=layer.attn_norm, **HC_KW)
        f = layer.step(a, pos)
        x, h, post, comb = hc_post_pre(f, x, post, comb, *layer.hc["ffn"], norm_weight=layer.ffn_norm, **HC_KW)
        return hc_post(layer.moe(h), x, post, comb)

    def head_step(self, x):
        y = hc_head(x, self.head_fn, self.head_base, self.head_scale, hc_eps=1e-6, norm_eps=EPS,
                    norm_weight=self.norm)
        return F.linear(y, self.head).float()

    def step(self, tokens, pos):
        x = self.embed[tokens][:, None, :].expand(-1, 4, -1).contiguous()
        for layer in self.layers:
            x = self.layer_step(layer, x, pos)
        return self.head_step(x)


# --------------------------------------------------------------------------- measurement

def copy_bandwidth(dev) -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    return 2 * a.numel() / sorted(ts)[len(ts) // 2]


def graph_ms(fn, reps=20) -> float:
    """Capture fn into a CUDA graph (after warm-up) and return the median replay time in ms."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    return sorted(ts)[len(ts) // 2]


def count_launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def breakdown(c, lin, moe_ok, dev, bsz: int, ctx: int) -> list[tuple[str, float, int]]:
    """(piece, graph ms, launches) of one CSA and one HCA layer: where a decode step's time goes."""
    m = Model(c, ["csa", "hca"], bsz, ctx, dev, lin, moe_ok)
    torch.manual_seed(bsz)
    pos = torch.full((bsz,), ctx - 1, device=dev, dtype=torch.long)
    x0 = m.embed[torch.randint(0, c["V"], (bsz,), device=dev)][:, None, :].expand(-1, 4, -1).contiguous()
    out = []
    for layer in m.layers:
        fn, base, scale = layer.hc["attn"]
        a, post, comb = hc_pre(x0, fn, base, scale, norm_weight=layer.attn_norm, **HC_KW)
        f = layer.step(a, pos)
        cos, sin = layer.cos[pos], layer.sin[pos]
        q = torch.randn(bsz, c["H"], c["HD"], device=dev).to(torch.bfloat16)
        idx = torch.randint(0, ctx // 4, (bsz, c["TOPK"]), device=dev).int() if layer.kind == "csa" else None
        cnt = (pos + 1) // 128 if layer.kind == "hca" else None
        cq = rms(lin(a, layer.wq_a), layer.q_norm)
        pieces = {
            "mhc pre (attn)": lambda: hc_pre(x0, fn, base, scale, norm_weight=layer.attn_norm, **HC_KW),
            "attention sub-layer": lambda: layer.step(a, pos),
            "  decode_attention kernel": lambda: decode_attention(
                q, pos, cos, sin, layer.wpool, layer.wtab, RING, c["W"], layer.cpool, layer.ctab, idx, cnt,
                layer.sink, c["HD"] ** -0.5),
            "  q/kv linears (wq_a,wq_b,wkv)": lambda: (lin(a, layer.wq_a), lin(cq, layer.wq_b), lin(a, layer.wkv)),
            "  wo_a bmm + wo_b": lambda: lin(torch.bmm(q.view(bsz, c["G"], -1).transpose(0, 1),
                                                        layer.wo_a.transpose(1, 2)).transpose(0, 1).reshape(bsz, -1),
                                              layer.wo_b),
            "  main compressor (torch)": lambda: layer.compress(layer.comp, a, pos),
            "mhc post+pre (ffn)": lambda: hc_post_pre(f, x0, post, comb, *layer.hc["ffn"],
                                                      norm_weight=layer.ffn_norm, **HC_KW),
            "moe (router+shared+routed)": lambda: layer.moe(a),
            "mhc post": lambda: hc_post(f, x0, post, comb),
        }
        for name, fn_ in pieces.items():
            try:
                out.append((f"{layer.kind} {name}", graph_ms(fn_), count_launches(fn_)))
            except Exception as e:  # noqa: BLE001 - e.g. a kernel of #5 mid-change
                print(f"breakdown {layer.kind} {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    del m
    torch.cuda.empty_cache()
    return out


def layer_bytes(layer: Layer, bsz: int, ctx: int, touched: float, ideal: bool) -> float:
    """Bytes one decode step of this layer must read (weights once, KV per sequence)."""
    c = layer.c
    w = sum(nbytes(x) for x in layer.weights)
    w += layer.wo_a.numel() * (1 if ideal else 2)
    w += sum(t.numel() * 2 for t in getattr(layer, "weights_bf16", []))
    w += layer.gate.numel() * 2 + 2 * 24 * 4 * c["D"] * 4  # router, mHC fn (fp32)
    w += touched * 3 * c["D"] * c["I"] * (0.5 + 1 / 32)  # routed MXFP4 experts
    kv = c["W"] * 584
    if layer.kind == "csa":
        kv += min(c["TOPK"], ctx // 4) * 584 + (ctx // 4) * (68 if ideal else 2 * c["IHD"])
    if layer.kind == "hca":
        kv += (ctx // 128) * 584 + 128 * 512 * 4 * 2  # entries + open-window compressor rows
    return w + bsz * kv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--contexts", default="4096,65536")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    c = TINY if args.tiny else FLASH
    lin = Linears(dev)
    moe_ok = True
    try:
        from dsv4.kernels.moe import fused_moe  # noqa: F401
    except Exception as e:  # noqa: BLE001
        moe_ok = False
        print("MoE kernel unavailable:", e)
    print(f"linears: {lin.note}", flush=True)
    results = []
    if dev == "cpu":  # smoke test of every code path
        m = Model(c, ["swa", "csa", "hca"], 2, 600, dev, lin, moe_ok)
        logits = m.step(torch.tensor([1, 2]), torch.tensor([599, 300]))
        print("tiny smoke logits", tuple(logits.shape), bool(torch.isfinite(logits).all()))
        return
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    for ctx in [int(v) for v in args.contexts.split(",")]:
        for bsz in [int(v) for v in args.batches.split(",")]:
            t0 = time.time()
            torch.manual_seed(bsz + ctx)
            try:
                m = Model(c, ["swa", "csa", "hca"], bsz, ctx, dev, lin, moe_ok)
                tokens = torch.randint(0, c["V"], (bsz,), device=dev)
                pos = torch.full((bsz,), ctx - 1, device=dev, dtype=torch.long)
                try:
                    m.step(tokens, pos)
                except Exception as e:  # noqa: BLE001 - the MoE kernel may refuse a shape
                    if not moe_ok:
                        raise
                    print(f"fused_moe failed ({type(e).__name__}: {str(e)[:100]}); MoE routed experts left out")
                    moe_ok = False
                    for layer in m.layers:
                        layer.experts = None
                torch.cuda.synchronize()
                x0 = m.embed[tokens][:, None, :].expand(-1, 4, -1).contiguous()
                per = {layer.kind: graph_ms(lambda layer=layer: m.layer_step(layer, x0, pos)) for layer in m.layers}
                head = graph_ms(lambda: m.head_step(x0))
                total = graph_ms(lambda: m.step(tokens, pos))
                launches = count_launches(lambda: m.step(tokens, pos))
                touched = c["E"] * (1 - (1 - c["K"] / c["E"]) ** bsz) if m.layers[0].experts is not None else 0
                lb = {layer.kind: layer_bytes(layer, bsz, ctx, touched, False) for layer in m.layers}
                lbi = {layer.kind: layer_bytes(layer, bsz, ctx, touched, True) for layer in m.layers}
                head_bytes = m.head.numel() * 2
                n43 = {"swa": 2, "csa": 21, "hca": 20}
                ext = head + sum(n43[k] * per[k] for k in per)
                ext_bytes = head_bytes + sum(n43[k] * lb[k] for k in lb)
                ext_ideal = head_bytes + sum(n43[k] * lbi[k] for k in lbi)
                stack_bytes = head_bytes + sum(lb.values())
                row = dict(batch=bsz, ctx=ctx, stack_ms=total, layer_ms=per, head_ms=head, launches=launches,
                           stack_roof_ms=stack_bytes / bw * 1e3, ext43_ms=ext, ext43_roof_ms=ext_bytes / bw * 1e3,
                           ext43_ideal_roof_ms=ext_ideal / bw * 1e3, moe=m.layers[0].experts is not None,
                           secs=time.time() - t0)
                results.append(row)
                print(json.dumps(row), flush=True)
                del m
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 - keep the other configurations
                print(f"batch {bsz} ctx {ctx}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    parts = {}
    for bsz in (1, 64):
        try:
            parts[bsz] = breakdown(c, lin, moe_ok, dev, bsz, 65536)
        except Exception as e:  # noqa: BLE001
            print(f"breakdown batch {bsz}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    with open(os.path.join(args.out, "bench_e2e.json"), "w") as f:
        json.dump(dict(copy_bw=bw, linears=lin.note, results=results, breakdown=parts), f, indent=1)
    for bsz, rows in parts.items():
        print(f"\nbreakdown, batch {bsz}, ctx 65536 (CUDA graph ms / launches)")
        for name, ms, n in rows:
            print(f"  {name:<42} {ms:7.3f} {n:5d}")
    print(f"\nlinears: {lin.note}; copy BW {bw / 1e12:.2f} TB/s; MoE routed experts: "
          f"{'fused_moe MXFP4' if moe_ok else 'LEFT OUT'}")
    print(f"{'B':>3} {'ctx':>6} | {'stack ms':>8} {'roof':>6} {'x':>5} | {'swa':>6} {'csa':>6} {'hca':>6} {'head':>6}"
          f" | {'43L ms':>7} {'roof':>6} {'x':>5} {'ideal':>6} | {'launch':>6}")
    for r in results:
        p = r["layer_ms"]
        print(f"{r['batch']:>3} {r['ctx']:>6} | {r['stack_ms']:8.3f} {r['stack_roof_ms']:6.3f} "
              f"{r['stack_ms'] / r['stack_roof_ms']:5.2f} | {p['swa']:6.3f} {p['csa']:6.3f} {p['hca']:6.3f} "
              f"{r['head_ms']:6.3f} | {r['ext43_ms']:7.2f} {r['ext43_roof_ms']:6.2f} "
              f"{r['ext43_ms'] / r['ext43_roof_ms']:5.2f} {r['ext43_ideal_roof_ms']:6.2f} | {r['launches']:6d}")


if __name__ == "__main__":
    main()
