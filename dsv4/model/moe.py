"""Mixture of experts (spec §2.9): sqrt-softplus gate, hash or biased top-k routing, clamped SwiGLU.

Gate (fp32): `s = sqrt(softplus(W_gate x))`. Top-k layers pick the k largest `s + bias` (the bias is
for selection only; ties go to the lowest expert id); hash layers take the ids from `tid2eid[token]`.
Weights `s_e / sum_{picked} s * routed_scaling_factor`. Each routed and the shared expert computes
`w2(bf16(weight * silu(min(w1 x, L)) * clamp(w3 x, -L, L)))` (the routing weight applied before w2);
the routed outputs are summed in fp32, the shared one added, and the total rounded.

Kernel mode (`kernels="triton"`): `pack_experts` (at finalize) stacks the quantised routed experts
into `dsv4.kernels.moe.PackedExperts` (MXFP4 stays packed) and frees the per-expert tensors; the
routed experts then run as one `fused_moe` (FP8 activations, reference numerics), and the gate as
one `dsv4.kernels.router.gate_route` launch at decode sizes (logits GEMV + routing; with `ROUTER_QUANTISES_X`,
on, it also quantises x for the MXFP4 experts' GLU), else its logits GEMM and one `route` launch. The shared
expert's w1/w3 are stacked into one w13 (`Expert.fuse_w13`, sharded TP slices too): w13 GEMM, one
`dsv4.kernels.swiglu` launch, w2 GEMM.

Sharded (`layout` given, see dsv4.distributed.sharding): this rank holds only its EP rank's experts
(the others are `RemoteExpert` placeholders) and its TP slice of the shared expert; the combine
across ranks lives in dsv4.distributed.moe_comm. In kernel mode only this rank's experts are packed
(local index = expert id - first owned id).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsv4.config import LayerSpec, ModelConfig
from dsv4.kernels._triton import HAS_TRITON, INTERPRET
from dsv4.kernels.router import GATE_ROUTE_MAX_T, gate_route, route, route_ref
from dsv4.model.linear import EXPERT, FP8, Linear, bf16_gemm_fp32
from dsv4.model.numerics import Numerics, acc_dtype
from dsv4.model.side_stream import start_beside

# Decode sizes, MXFP4 experts: the router's launch also writes x quantised for the routed experts' per-pair GLU
# (`gate_route(x_quant=)`), which then needs no quantisation launch of its own: one launch fewer in the layer's
# dependent chain. The same quantisation code (`moe_mma_operands.quant16_block`), so the same bits. 8-layer B = 1
# rows on a quiet GPU (s46a, alternating): replay 1.20 / 1.20 ms on vs 1.21 / 1.21 off, 246 vs 254 kernels per
# eager step (session 45's 1.26 vs 1.25 ran beside stray test workers). False: the separate launch.
ROUTER_QUANTISES_X = True


class Gate(nn.Module):
    def __init__(self, config: ModelConfig, spec: LayerSpec, dtype: torch.dtype):
        super().__init__()
        self.is_hash = spec.moe == "hash"
        self.top_k = config.num_experts_per_tok
        self.n_experts = config.n_routed_experts
        self.normalize = config.norm_topk_prob
        self.route_scale = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size, dtype=dtype),
                                   requires_grad=False)
        if self.is_hash:
            self.register_buffer("tid2eid", torch.empty(config.vocab_size, self.top_k, dtype=torch.int64))
        else:
            self.bias = nn.Parameter(torch.empty(config.n_routed_experts, dtype=acc_dtype(dtype)),
                                     requires_grad=False)
        self.use_kernels = False  # kernel mode (set at finalize): dsv4.kernels.router (see forward)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor | None,
                x_quant: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (routing weights [T, k] fp32, expert ids [T, k]). Kernel mode: decode sizes run the logits
        GEMV and the routing as one `gate_route` launch; otherwise the logits GEMM, then one `route`.
        `x_quant`: buffers `gate_route` fills with x quantised for the routed GLU (only where
        `fused_applies`: the caller checks)."""
        if self.is_hash and token_ids is None:
            raise ValueError("hash-routed MoE layers need input_ids (got only inputs_embeds)")
        args = dict(bias=None if self.is_hash else self.bias, tid2eid=self.tid2eid if self.is_hash else None,
                    token_ids=token_ids if self.is_hash else None, normalize=self.normalize,
                    route_scale=self.route_scale)
        if self.fused_applies(x, token_ids):
            weights, ids, _ = gate_route(x, self.weight, self.top_k, x_quant=x_quant, **args)
            return weights, ids
        if x_quant is not None:
            raise ValueError("Gate: x_quant is filled by the fused decode launch only (see fused_applies)")
        acc = acc_dtype(x.dtype)
        logits = bf16_gemm_fp32(x, self.weight) if acc == torch.float32 else None
        if logits is None:
            logits = F.linear(x.to(acc), self.weight.to(acc))
        if self.use_kernels and logits.is_cuda and logits.dtype == torch.float32 \
                and (not self.is_hash or token_ids.device == logits.device):
            return route(logits, self.top_k, **args)  # the epilogue below as one launch
        return route_ref(logits, self.top_k, **args)

    def fused_applies(self, x: torch.Tensor, token_ids: torch.Tensor | None) -> bool:
        """Kernel mode, bf16, 1..GATE_ROUTE_MAX_T rows on CUDA (or Triton's interpreter, for tests)."""
        return (self.use_kernels and HAS_TRITON and (x.is_cuda or INTERPRET) and x.dim() == 2
                and 1 <= x.shape[0] <= GATE_ROUTE_MAX_T and x.stride(-1) == 1
                and x.dtype == torch.bfloat16 and self.weight.dtype == torch.bfloat16
                and (not self.is_hash or token_ids.device == x.device))


class Expert(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, numerics: Numerics, weight_format: str,
                 intermediate: int | None = None):
        super().__init__()
        d, i = config.hidden_size, intermediate or config.moe_intermediate_size
        self.limit = config.swiglu_limit
        self.w1 = Linear(d, i, dtype, numerics, weight_format)
        self.w2 = Linear(i, d, dtype, numerics, weight_format)
        self.w3 = Linear(d, i, dtype, numerics, weight_format)
        # kernel mode after fuse_w13: w1 over w3 as one FP8 weight [2I, D] + scale [2I/128, D/128]
        self.w13_weight: torch.Tensor | None = None
        self.w13_scale: torch.Tensor | None = None

    def fuse_w13(self) -> None:
        """Kernel mode, FP8 w1/w3: stack them into one weight so that gate and up are one GEMM.
        w1/w3 become row views of it (no second copy; a later `load_quantized` of w1 or w3 writes
        through into the fused weight). Plain attributes, not buffers: the loader's tensor list is
        unchanged and the model is not moved after finalize (like `MoE.packed`)."""
        w1, w3 = self.w1, self.w3
        if self.w13_weight is not None or w1.kernel_format != "fp8" or w3.kernel_format != "fp8":
            return
        i = w1.out_features
        weight = torch.cat([w1.weight.detach(), w3.weight.detach()])  # 128-row blocks stay whole (I % 128 == 0)
        scale = torch.cat([w1.scale, w3.scale])
        for lin, rows, srows in ((w1, slice(0, i), slice(0, i // 128)), (w3, slice(i, 2 * i), slice(i // 128, None))):
            lin.weight = nn.Parameter(weight[rows], requires_grad=False)
            lin.scale = scale[srows]
        self.w13_weight, self.w13_scale = weight, scale

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None, input_ready: bool = False,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """w2 output in out_dtype (default: rounded to the input dtype; a TP slice of the shared
        expert asks for the accumulation dtype, to be summed over ranks before rounding)."""
        if self.w13_weight is not None:  # kernel mode: w13 GEMM -> SwiGLU -> w2 GEMM, three launches
            from dsv4.kernels.fp8_linear import fp8_linear
            from dsv4.kernels.swiglu import swiglu
            z = swiglu(fp8_linear(x, self.w13_weight, self.w13_scale), self.limit, weight)
            return self.w2(z, out_dtype=out_dtype)
        acc = acc_dtype(x.dtype)
        if not input_ready:
            x = self.w1.prepare_input(x)
        gate = self.w1(x, input_ready=True).to(acc).clamp(max=self.limit)
        up = self.w3(x, input_ready=True).to(acc).clamp(-self.limit, self.limit)
        z = F.silu(gate) * up
        if weight is not None:
            z = weight.unsqueeze(-1) * z
        return self.w2(z.to(x.dtype), out_dtype=out_dtype)


class RemoteExpert(nn.Module):
    """Placeholder for a routed expert held by another EP rank (keeps `experts.{e}` = expert e)."""


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, spec: LayerSpec, dtype: torch.dtype, numerics: Numerics,
                 layout=None):
        super().__init__()
        self.layout = layout
        self.limit = config.swiglu_limit
        self.packed = None  # kernel mode: dsv4.kernels.moe.PackedExperts after pack_experts()
        self.quantize_input = numerics.quantize_activations  # routed and shared inputs alike
        owned = layout.experts if layout is not None else range(config.n_routed_experts)
        self.gate = Gate(config, spec, dtype)
        self.experts = nn.ModuleList(Expert(config, dtype, numerics, EXPERT) if e in owned else RemoteExpert()
                                     for e in range(config.n_routed_experts))
        shared_inter = layout.shared_inter if layout is not None else None
        self.shared_experts = Expert(config, dtype, numerics, FP8, shared_inter) if config.n_shared_experts else None

    def pack_experts(self) -> None:
        """Kernel mode: routed experts -> the fused MoE kernel's layout, the shared expert's w1/w3 ->
        one w13 (once, after loading)."""
        if self.shared_experts is not None:
            self.shared_experts.fuse_w13()
        mine = [e for e in self.experts if isinstance(e, Expert)]  # this rank's, ascending id
        fmt = mine[0].w1.kernel_format if mine else None
        if fmt is None or self.packed is not None:
            return
        from dsv4.kernels.moe import ExpertWeights, finalize_experts
        stacked = {f"{w}{part}": torch.stack([getattr(getattr(e, w), "weight" if not part else "scale")
                                              for e in mine])
                   for w in ("w1", "w2", "w3") for part in ("", "_scale")}
        self.packed = finalize_experts(ExpertWeights(fmt, **stacked))
        for e in mine:  # the packed copy is the only one kept
            for w in (e.w1, e.w2, e.w3):
                w.weight = nn.Parameter(w.weight.new_empty(0), requires_grad=False)
                w.scale = w.scale.new_empty(0)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor | None) -> torch.Tensor:
        acc = acc_dtype(x.dtype)
        if self.packed is not None and self.layout is None:
            from dsv4.kernels.moe import fused_moe
            shared = None
            if self.shared_experts is not None:  # beside the router and routed experts (dsv4.model.side_stream)
                shared = start_beside(x.device, "shared_expert", x.shape[0], self.shared_experts, x)
            x_quant = None
            if ROUTER_QUANTISES_X and self.packed.fmt == "mxfp4" and x.shape[-1] % 128 == 0 \
                    and self.gate.fused_applies(x, token_ids):
                t, d = x.shape
                x_quant = (torch.empty(t, d, dtype=torch.float16, device=x.device),
                           torch.empty(t, d // 128, dtype=torch.float32, device=x.device))
            weights, ids = self.gate(x, token_ids, x_quant)  # the combine calls the join before adding the shared
            return fused_moe(x, ids, weights, self.packed, self.limit, act="fp8", shared=shared, x_quant=x_quant)
        weights, ids = self.gate(x, token_ids)
        if self.layout is not None:
            from dsv4.distributed.moe_comm import moe_forward
            return moe_forward(self, x, weights, ids)
        xq = self.experts[0].w1.prepare_input(x)  # per-row quantisation: shared by all experts
        y = torch.zeros(x.shape, dtype=acc, device=x.device)
        for e in torch.unique(ids).tolist():  # ascending expert id: a fixed summation order
            tokens, slot = torch.where(ids == e)
            y.index_add_(0, tokens, self.experts[e](xq[tokens], weights[tokens, slot], input_ready=True).to(acc))
        if self.shared_experts is not None:
            y += self.shared_experts(xq, input_ready=True).to(acc)
        return y.to(x.dtype)
