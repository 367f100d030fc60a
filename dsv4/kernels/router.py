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

`gate_route(x [T, D] bf16, weight [E, D] bf16, k, ...)` -> (weights, ids, logits [T, E] fp32) is Gate's
decode-size path: the logits GEMV and `route` in one launch. Programs split the weight over experts and
hidden slices and store fp32 partial logits; per group of rows, the last program to arrive (an arrival
counter it resets for the next launch / CUDA-graph replay) sums the partials in slice order and runs the
same routing epilogue (`_route_epilogue`, shared with `route`'s kernel). Its logits are exact bf16
products summed in fp32 in its own fixed order, which is not cuBLAS's: the same up to fp32 rounding, so
the ids can differ from the two-launch path where two keys are within a few ulps.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton
from dsv4.kernels._triton import pdl_kernel, pdl_wait
from dsv4.kernels.moe_mma_operands import check_x_quant

if HAS_TRITON:
    from dsv4.kernels.moe_mma_operands import quant16_block


# --------------------------------------------------------------------------- torch reference

def _position_invariant(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise fn, every element through the same code path. On CPU, torch finishes a tensor's last
    partial SIMD vector with the scalar function, which can round 1 ulp apart from the vector one (AVX512 softplus,
    session 39: equal logits at positions 224-251 of a [21, 12] tensor scored 1 ulp higher), so equal logits would
    not tie. Padding to whole vectors (64 elements covers AVX512's 2 x 16 lanes) keeps every element on the vector
    path; tensors past torch's 32,768-element grain may still split into per-thread chunks."""
    if x.device.type != "cpu":
        return fn(x)
    n = x.numel()
    flat = torch.nn.functional.pad(x.reshape(-1), (0, -n % 64))
    return fn(flat)[:n].reshape(x.shape)


def route_ref(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None, tid2eid: torch.Tensor | None = None,
              token_ids: torch.Tensor | None = None, normalize: bool = True,
              route_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch `route` in the logits' dtype (Gate's own path)."""
    from dsv4.model.indexer import top_k_lowest_index
    scores = _position_invariant(lambda x: torch.nn.functional.softplus(x).sqrt(), logits)
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
    def _route_epilogue(x, row, BIAS, T2E, TOK, W_OUT, ID_OUT, stride_t2e, stride_tok, route_scale,
                        E: tl.constexpr, BE: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, P: tl.constexpr,
                        HAS_BIAS: tl.constexpr, HASH: tl.constexpr, NORMALIZE: tl.constexpr,
                        INTERP: tl.constexpr):
        """`route` of one row: x = its fp32 logits [BE] over columns 0..BE-1 (padding ignored) -> the
        row's k weights and ids stored at W_OUT / ID_OUT + row * K. Shared by both kernels below."""
        slot = tl.arange(0, BK)
        in_k = slot < K
        col = tl.arange(0, BE)
        valid = col < E
        if HASH:
            tok = tl.load(TOK + row * stride_tok).to(tl.int64)
            ids = tl.load(T2E + tok * stride_t2e + slot, mask=in_k, other=0).to(tl.int64)
            ok = in_k & (ids >= 0) & (ids < E)  # a bad table entry picks nothing: NaN weight
            picked = tl.gather(x, tl.where(ok, ids, 0).to(tl.int32), axis=0)  # the picked logits, exact
            w = tl.where(ok, _sqrt_softplus(picked, INTERP), float("nan"))
        else:
            s = _sqrt_softplus(x, INTERP)
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
            # that order in the high bits, BE - 1 - id in the low ones: one max per pick finds the largest key
            # and, among equal keys, the lowest id (a max, a min and a sum per pick, each a reduction across the
            # CTA's warps, took 18 for k = 6: session 43, H200, Flash gate_route in a graph 5.2 -> 4.2 µs at T = 1)
            packed = order.to(tl.int64) * BE + (BE - 1 - col)
            ids = tl.zeros([BK], dtype=tl.int64)
            for j in tl.static_range(K):
                top = tl.max(packed, axis=0)
                pick = (BE - 1) - (top & (BE - 1))
                ids = tl.where(slot == j, pick, ids)
                packed = tl.where(col == pick, -9223372036854775807 - 1, packed)
            w = tl.gather(s, tl.where(in_k, ids, 0).to(tl.int32), axis=0)  # exact; keeps NaN
        if NORMALIZE:
            w = tl.div_rn(w, _pairwise_sum(tl.where(in_k, w, 0.0), BK, P))
        w = w * route_scale
        tl.store(W_OUT + row * K + slot, w, mask=in_k)
        tl.store(ID_OUT + row * K + slot, ids, mask=in_k)

    @triton.jit
    def _route_kernel(L, BIAS, T2E, TOK, W_OUT, ID_OUT, stride_l, stride_t2e, stride_tok, route_scale,
                      E: tl.constexpr, BE: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, P: tl.constexpr,
                      HAS_BIAS: tl.constexpr, HASH: tl.constexpr, NORMALIZE: tl.constexpr,
                      INTERP: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BE)
        x = tl.load(L + row * stride_l + col, mask=col < E, other=0.0)
        _route_epilogue(x, row, BIAS, T2E, TOK, W_OUT, ID_OUT, stride_t2e, stride_tok, route_scale,
                        E, BE, K, BK, P, HAS_BIAS, HASH, NORMALIZE, INTERP)

    @pdl_kernel
    @triton.jit
    def _gate_route_kernel(X, W, PART, LOGITS, CNT, BIAS, T2E, TOK, W_OUT, ID_OUT, XQ, SX, T, stride_x, stride_w,
                           stride_t2e, stride_tok, stride_xq, stride_sx, route_scale,
                           D: tl.constexpr, BN: tl.constexpr, KS: tl.constexpr, S: tl.constexpr,
                           RB: tl.constexpr, E: tl.constexpr, BE: tl.constexpr, K: tl.constexpr,
                           BK: tl.constexpr, P: tl.constexpr, HAS_BIAS: tl.constexpr, HASH: tl.constexpr,
                           NORMALIZE: tl.constexpr, INTERP: tl.constexpr, QX: tl.constexpr):
        """Program (i, g): experts [BN * (i // S), +BN) x hidden [KS * (i % S), +KS) for the rows of
        group g ([RB * g, +RB) of T); partial logits -> PART [S, T, E]. The group's last arriver sums
        each row's S partials in split order (the same bits whoever arrives last), stores the logits
        and runs the routing epilogue. QX: the programs of each hidden slice also quantise its 128-blocks
        of the group's rows for the routed experts (`moe_mma_operands.quant16_block` -> XQ, SX), block b of the
        slice by expert tile b mod (tiles)."""
        pid = tl.program_id(0)
        grp = tl.program_id(1)
        split = pid % S  # neighbouring programs: the same experts, consecutive hidden slices
        rn = (pid // S) * BN + tl.arange(0, BN)
        rk = split * KS + tl.arange(0, KS)
        n_ok, k_ok = rn < E, rk < D
        # the whole weight tile is loaded up front: one burst of loads in flight per program
        wt = tl.load(W + rn[:, None].to(tl.int64) * stride_w + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        pdl_wait()  # only the (static) weight tile above is read before it
        t0 = grp * RB
        for r in range(RB):
            t = t0 + r
            if t < T:
                xv = tl.load(X + t * stride_x + rk, mask=k_ok, other=0.0).to(tl.float32)
                part = tl.sum(wt * xv[None, :], axis=1)  # bf16 x bf16 products are exact in fp32
                tl.store(PART + (split * T + t) * E + rn, part, mask=n_ok)
        # Publish the partials, count the arrival (the ordering of fp8_linear's split K: the CTA barrier
        # orders every thread's stores before the one thread's gpu-scope acq_rel atomic; in the last
        # arriver its acquire, then a second barrier, order the .cg (L2) loads after all releases).
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + grp, 1, sem="acq_rel", scope="gpu")
        if QX:  # after the arrival: the group's last arriver need not wait for it (the next launch does)
            for b in range(pid // S, KS // 128, (E + BN - 1) // BN):
                if split * KS + b * 128 < D:
                    for r in range(RB):
                        if t0 + r < T:
                            quant16_block(X + (t0 + r) * stride_x, XQ + (t0 + r) * stride_xq,
                                          SX + (t0 + r) * stride_sx, split * (KS // 128) + b)
        if arrived == tl.num_programs(0) - 1:  # uniform over the CTA: the atomic's result is broadcast
            tl.debug_barrier()
            col = tl.arange(0, BE)
            valid = col < E
            for r in range(RB):
                t = t0 + r
                if t < T:
                    x = tl.zeros([BE], dtype=tl.float32)
                    for sp in tl.static_range(S):
                        x += tl.load(PART + (sp * T + t) * E + col, mask=valid, other=0.0, cache_modifier=".cg")
                    tl.store(LOGITS + t * E + col, x, mask=valid)
                    # (the bias loaded by every program before the PDL wait timed the same: session 43)
                    _route_epilogue(x, t, BIAS, T2E, TOK, W_OUT, ID_OUT, stride_t2e, stride_tok,
                                    route_scale, E, BE, K, BK, P, HAS_BIAS, HASH, NORMALIZE, INTERP)
            # every program of the group has arrived, nothing else touches its counter in this launch:
            # zero it for the next launch (and for CUDA-graph replays)
            tl.store(CNT + grp, 0)


def _check_routing(who, t, e, device, k, bias, tid2eid, token_ids) -> None:
    """The routing arguments of `route` / `gate_route` for T = t rows of E = e experts on `device`."""
    if not isinstance(k, int) or not 1 <= k <= min(e, 63):  # 63: see _pairwise_sum
        raise ValueError(f"{who}: need 1 <= k <= min(E = {e}, 63), got k = {k!r}")
    others = {"bias": bias, "tid2eid": tid2eid, "token_ids": token_ids}
    for name, v in others.items():
        if v is not None and v.device != device:
            raise ValueError(f"{who}: {name} is on {v.device}, the logits' inputs on {device}")
    if tid2eid is not None:
        if bias is not None:
            raise ValueError(f"{who}: hash routing (tid2eid) takes no bias")
        if token_ids is None:
            raise ValueError(f"{who}: hash routing needs token_ids")
        if tid2eid.dim() != 2 or tid2eid.shape[1] != k or tid2eid.dtype not in (torch.int32, torch.int64) \
                or tid2eid.stride(1) != 1:
            raise ValueError(f"{who}: tid2eid must be int32/int64 [V, k={k}] with contiguous rows, "
                             f"got {tid2eid.dtype} {tuple(tid2eid.shape)}")
        if token_ids.dim() != 1 or token_ids.shape[0] != t or token_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{who}: token_ids must be int32/int64 [T={t}], "
                             f"got {token_ids.dtype} {tuple(token_ids.shape)}")
    elif token_ids is not None:
        raise ValueError(f"{who}: token_ids given without tid2eid")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (e,) or bias.stride(0) != 1):
        raise ValueError(f"{who}: bias must be contiguous fp32 [E={e}], got {bias.dtype} {tuple(bias.shape)}")


def _check(logits, k, bias, tid2eid, token_ids) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"route: logits must be fp32 [T, E], got {logits.dtype} {tuple(logits.shape)}")
    if logits.shape[1] > 0 and logits.stride(1) != 1:
        raise ValueError("route: logits rows must be contiguous (stride(1) == 1)")
    _check_routing("route", logits.shape[0], logits.shape[1], logits.device, k, bias, tid2eid, token_ids)


def _epilogue_args(e: int, k: int, bias, tid2eid, token_ids, normalize: bool, route_scale: float,
                   dummy: torch.Tensor) -> dict:
    """`_route_epilogue`'s arguments as launch keywords (`dummy` stands in for absent tensors)."""
    hashed = tid2eid is not None
    bk = triton.next_power_of_2(k)
    return dict(BIAS=bias if bias is not None else dummy, T2E=tid2eid if hashed else dummy,
                TOK=token_ids if hashed else dummy, stride_t2e=tid2eid.stride(0) if hashed else 0,
                stride_tok=token_ids.stride(0) if hashed else 0, route_scale=float(route_scale),
                E=e, BE=triton.next_power_of_2(e), K=k, BK=bk, P=bk if bk == k else bk // 2,
                HAS_BIAS=bias is not None, HASH=hashed, NORMALIZE=bool(normalize), INTERP=INTERPRET)


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
    args = _epilogue_args(e, k, bias, tid2eid, token_ids, normalize, route_scale, ids)
    _route_kernel[(t,)](
        L=logits, W_OUT=weights, ID_OUT=ids, stride_l=logits.stride(0), **args,
        num_warps=1 if args["BE"] <= 512 else 4,  # a few warp-shuffle reductions per pick, no block barriers
        enable_reflect_ftz=False)  # libdevice without FTZ, as torch's CUDA math library
    return weights, ids


# --------------------------------------------------------------------------- logits GEMV + route, one launch

GATE_ROUTE_MAX_T = 16  # Gate takes the fused path up to this many rows (decode sizes)


def gate_route_config(e: int, d: int) -> dict:
    """Default tiling of `gate_route`: 8K-element weight tiles (16 KB of bf16: one burst of loads per
    program), 1024-wide hidden slices (Flash: 32 expert tiles x 4 splits = 128 programs; Pro: 48 x 7),
    four rows per group (the last arriver of each group routes its rows one after another)."""
    block_k = min(1024, triton.next_power_of_2(d))
    return dict(block_n=max(1, min(8192 // block_k, triton.next_power_of_2(e))), block_k=block_k,
                rows_per_group=4, num_warps=4)


def gate_route(x: torch.Tensor, weight: torch.Tensor, k: int, bias: torch.Tensor | None = None,
               tid2eid: torch.Tensor | None = None, token_ids: torch.Tensor | None = None, normalize: bool = True,
               route_scale: float = 1.0, block_n: int | None = None, block_k: int | None = None,
               rows_per_group: int | None = None, num_warps: int | None = None,
               x_quant: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`route(x @ weight.T in fp32, ...)` for bf16 x [T, D] and weight [E, D] as one launch (decode sizes,
    T <= GATE_ROUTE_MAX_T is what it is tuned for) -> (weights [T, k] fp32, ids [T, k] int64, logits
    [T, E] fp32). The logits are exact bf16 products summed in fp32: per (row, expert) a fixed tree over
    each `block_k` hidden slice, then the slices in order (not cuBLAS's order, which is unspecified too;
    independent of T and of which program arrives last). No host syncs; the arrival counters are
    allocated on the first call for a device (run once eagerly before a CUDA-graph capture). `x_quant` (xq [T, D]
    f16, sx [T, D/128] fp32, D a multiple of 128): the same launch also writes x quantised for the routed experts'
    GLU (`moe_gemv(x_quant=)`), so the GLU needs no quantisation launch of its own."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.router.gate_route needs triton")
    if x.dim() != 2 or weight.dim() != 2 or x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 \
            or x.shape[1] != weight.shape[1] or x.shape[1] == 0:
        raise ValueError(f"gate_route: x must be bf16 [T, D] and weight bf16 [E, D], got x {x.dtype} "
                         f"{tuple(x.shape)}, weight {weight.dtype} {tuple(weight.shape)}")
    if x.device != weight.device:
        raise ValueError(f"gate_route: x is on {x.device}, weight on {weight.device}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("gate_route: x and weight rows must be contiguous (stride(1) == 1)")
    (t, d), e = x.shape, weight.shape[0]
    _check_routing("gate_route", t, e, x.device, k, bias, tid2eid, token_ids)
    cfg = gate_route_config(e, d)
    bn, ks = block_n or cfg["block_n"], block_k or cfg["block_k"]
    rb, warps = rows_per_group or cfg["rows_per_group"], num_warps or cfg["num_warps"]
    if any(v & (v - 1) for v in (bn, ks)) or rb < 1:
        raise ValueError(f"gate_route: block_n ({bn}) and block_k ({ks}) must be powers of two, "
                         f"rows_per_group ({rb}) positive")
    dev = x.device
    xq, sx = (x, x) if x_quant is None else check_x_quant("gate_route", x_quant, x)  # (x: unread without QX)
    weights = torch.empty(t, k, dtype=torch.float32, device=dev)
    ids = torch.empty(t, k, dtype=torch.int64, device=dev)
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)
    if t == 0:
        return weights, ids, logits
    splits, groups = triton.cdiv(d, ks), triton.cdiv(t, rb)
    partials = torch.empty(splits, t, e, dtype=torch.float32, device=dev)
    counters = arrival_counters("router gate_route", dev, groups)
    _gate_route_kernel[(triton.cdiv(e, bn) * splits, groups)](
        X=x, W=weight, PART=partials, LOGITS=logits, CNT=counters, W_OUT=weights, ID_OUT=ids,
        XQ=xq, SX=sx, T=t, stride_x=x.stride(0), stride_w=weight.stride(0), stride_xq=xq.stride(0),
        stride_sx=sx.stride(0), D=d, BN=bn, KS=ks, S=splits, RB=rb, QX=x_quant is not None,
        **_epilogue_args(e, k, bias, tid2eid, token_ids, normalize, route_scale, ids),
        num_warps=warps, enable_reflect_ftz=False)
    return weights, ids, logits
