"""The MoE router's epilogue (dsv4.model.moe.Gate after its logits GEMM) as one Triton launch.

`route(logits [T, E] fp32, k, bias=None, tid2eid=None, token_ids=None, normalize=True, route_scale=1.0)`
-> (weights [T, k] fp32, ids [T, k] int64):

* scores `s = sqrt(softplus(logits))` (softplus with beta 1, threshold 20, as torch);
* ids: the k largest `s + bias` per row in descending order, equal keys in increasing expert id
  (a stable descending sort; NaN keys rank first, as in torch's sort) -- or, for hash layers
  (`tid2eid` [V, k] given), `tid2eid[token_ids]`;
* weights `s[ids]`, divided by their sum when `normalize`, times `route_scale` (rounded to fp32).

`route_ref` is the same in torch (the model's own path, any float dtype). The kernel runs one program
per row with no host syncs (CUDA-graph capturable). On CUDA the ids and, without normalisation, the
weights are bit-identical to the torch path: the scores use the CUDA math library's expf/log1pf
(libdevice, FTZ off, as torch is built) and a correctly rounded sqrt; the division is correctly
rounded. The normalising sum adds the k picks pairwise in a fixed order; torch's CUDA `.sum(-1)`
adds them in another (measured on the H200: normalised weights differ by up to 2 ulp). Triton's CPU
interpreter has no libdevice: there the scores use numpy's exp/log (a few ulps off), for developer
checks only.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton


# --------------------------------------------------------------------------- torch reference

def route_ref(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None, tid2eid: torch.Tensor | None = None,
              token_ids: torch.Tensor | None = None, normalize: bool = True,
              route_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch `route` in the logits' dtype (Gate's own path)."""
    from dsv4.model.indexer import top_k_lowest_index
    scores = torch.nn.functional.softplus(logits).sqrt()
    if tid2eid is not None:
        if token_ids is None:
            raise ValueError("hash routing needs token_ids")
        ids = tid2eid[token_ids].long()
    else:
        ids = top_k_lowest_index(scores if bias is None else scores + bias.to(scores.dtype), k)
    weights = scores.gather(1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * route_scale, ids


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:
    from triton.language.extra import libdevice

    @triton.jit
    def _sqrt_softplus(x, INTERP: tl.constexpr):
        """torch CUDA: `x > 20 ? x : log1pf(expf(x))`, then IEEE sqrtf."""
        if INTERP:  # the interpreter runs no libdevice: log1p(y) = log(1+y) * y / ((1+y) - 1)
            y = tl.exp(tl.minimum(x, 30.0))  # x > 20 takes x below; no overflow warnings
            u = 1.0 + y
            sp = tl.where(u == 1.0, y, tl.log(u) * (y / tl.where(u == 1.0, 1.0, u - 1.0)))
        else:
            sp = libdevice.log1p(libdevice.exp(x))
        return tl.sqrt_rn(tl.where(x > 20.0, x, sp))

    @triton.jit
    def _pairwise_sum(v, BK: tl.constexpr, P: tl.constexpr):
        """Sum of v [BK] (zero-padded, k < 64) in a fixed pairwise order: with P = pow2 <= k, v[t] +
        v[t+P] first, then neighbours (offsets 1, 2, ..). Modelled on torch's CUDA reduce for short rows,
        but torch's `.sum(-1)` measured up to 2 ulp away on the H200 after the division: not its order."""
        if BK > P:
            v = tl.sum(tl.reshape(v, (2, P)), axis=0)
        if P >= 32:
            v = tl.sum(tl.reshape(v, (16, 2)), axis=1)
        if P >= 16:
            v = tl.sum(tl.reshape(v, (8, 2)), axis=1)
        if P >= 8:
            v = tl.sum(tl.reshape(v, (4, 2)), axis=1)
        if P >= 4:
            v = tl.sum(tl.reshape(v, (2, 2)), axis=1)
        return tl.sum(v, axis=0)

    @triton.jit
    def _route_kernel(L, BIAS, T2E, TOK, W_OUT, ID_OUT, stride_l, stride_t2e, stride_tok, route_scale,
                      E: tl.constexpr, BE: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, P: tl.constexpr,
                      HAS_BIAS: tl.constexpr, HASH: tl.constexpr, NORMALIZE: tl.constexpr,
                      INTERP: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        slot = tl.arange(0, BK)
        in_k = slot < K
        if HASH:
            tok = tl.load(TOK + row * stride_tok).to(tl.int64)
            ids = tl.load(T2E + tok * stride_t2e + slot, mask=in_k, other=0).to(tl.int64)
            ok = in_k & (ids >= 0) & (ids < E)  # a bad table entry reads no memory: NaN weight
            w = _sqrt_softplus(tl.load(L + row * stride_l + ids, mask=ok, other=float("nan")), INTERP)
        else:
            col = tl.arange(0, BE)
            valid = col < E
            s = _sqrt_softplus(tl.load(L + row * stride_l + col, mask=valid, other=0.0), INTERP)
            key = s
            if HAS_BIAS:
                key = s + tl.load(BIAS + col, mask=valid, other=0.0)
            # fp32 -> int32 of the same order (exact max/== on ints); +0.0 merges -0 into +0 (equal
            # in torch's sort), NaN -> the top, padding and picked entries -> INT_MIN (below -inf)
            key = key + 0.0
            bits = key.to(tl.int32, bitcast=True)
            order = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
            order = tl.where(key != key, 0x7FFFFFFF, order)
            order = tl.where(valid, order, -2147483648)
            ids = tl.zeros([BK], dtype=tl.int64)
            w = tl.zeros([BK], dtype=tl.float32)
            for j in tl.static_range(K):  # max, then the lowest id among the maxima, then drop it
                top = tl.max(order, axis=0)
                pick = tl.min(tl.where(order == top, col, BE), axis=0)
                hit = col == pick
                ids = tl.where(slot == j, pick.to(tl.int64), ids)
                w = tl.where(slot == j, tl.sum(tl.where(hit, s, 0.0), axis=0), w)  # exact; keeps NaN
                order = tl.where(hit, -2147483648, order)
        if NORMALIZE:
            w = tl.div_rn(w, _pairwise_sum(tl.where(in_k, w, 0.0), BK, P))
        w = w * route_scale
        tl.store(W_OUT + row * K + slot, w, mask=in_k)
        tl.store(ID_OUT + row * K + slot, ids, mask=in_k)


def _check(logits, k, bias, tid2eid, token_ids) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"route: logits must be fp32 [T, E], got {logits.dtype} {tuple(logits.shape)}")
    if logits.shape[1] > 0 and logits.stride(1) != 1:
        raise ValueError("route: logits rows must be contiguous (stride(1) == 1)")
    e = logits.shape[1]
    if not isinstance(k, int) or not 1 <= k <= min(e, 63):  # 63: see _pairwise_sum
        raise ValueError(f"route: need 1 <= k <= min(E = {e}, 63), got k = {k!r}")
    others = {"bias": bias, "tid2eid": tid2eid, "token_ids": token_ids}
    for name, t in others.items():
        if t is not None and t.device != logits.device:
            raise ValueError(f"route: {name} is on {t.device}, logits on {logits.device}")
    if tid2eid is not None:
        if bias is not None:
            raise ValueError("route: hash routing (tid2eid) takes no bias")
        if token_ids is None:
            raise ValueError("route: hash routing needs token_ids")
        if tid2eid.dim() != 2 or tid2eid.shape[1] != k or tid2eid.dtype not in (torch.int32, torch.int64) \
                or tid2eid.stride(1) != 1:
            raise ValueError(f"route: tid2eid must be int32/int64 [V, k={k}] with contiguous rows, "
                             f"got {tid2eid.dtype} {tuple(tid2eid.shape)}")
        if token_ids.dim() != 1 or token_ids.shape[0] != logits.shape[0] \
                or token_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"route: token_ids must be int32/int64 [T={logits.shape[0]}], "
                             f"got {token_ids.dtype} {tuple(token_ids.shape)}")
    elif token_ids is not None:
        raise ValueError("route: token_ids given without tid2eid")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (e,) or bias.stride(0) != 1):
        raise ValueError(f"route: bias must be contiguous fp32 [E={e}], got {bias.dtype} {tuple(bias.shape)}")


def route(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None, tid2eid: torch.Tensor | None = None,
          token_ids: torch.Tensor | None = None, normalize: bool = True,
          route_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `route_ref` for fp32 logits: one launch, no host syncs."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.router.route needs triton")
    _check(logits, k, bias, tid2eid, token_ids)
    t, e = logits.shape
    weights = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, k, dtype=torch.int64, device=logits.device)
    if t == 0:
        return weights, ids
    hashed = tid2eid is not None
    be, bk = triton.next_power_of_2(e), triton.next_power_of_2(k)
    _route_kernel[(t,)](
        logits, bias if bias is not None else logits, tid2eid if hashed else ids,
        token_ids if hashed else ids, weights, ids,
        logits.stride(0), tid2eid.stride(0) if hashed else 0, token_ids.stride(0) if hashed else 0,
        float(route_scale),
        E=e, BE=be, K=k, BK=bk, P=bk if bk == k else bk // 2, HAS_BIAS=bias is not None, HASH=hashed,
        NORMALIZE=bool(normalize), INTERP=INTERPRET,
        num_warps=1 if be <= 512 else 4,  # a few warp-shuffle reductions per pick, no block barriers
        enable_reflect_ftz=False)  # libdevice without FTZ, as torch's CUDA math library
    return weights, ids
