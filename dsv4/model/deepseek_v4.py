"""DeepSeek-V4 causal LM: the exact CPU reference forward pass (spec deepseek_v4_model.md §2).

    h = embed[token];  X = [h] * hc                       residual streams [T, hc, D]
    X = Block_l(X)  for every layer                        (mHC + attention, mHC + MoE)
    hidden = norm(hc_head(X))                              what `forward` returns, [T, D]
    logits = head(hidden)                                  `compute_logits`, fp32 [T, V]

Parameter names are the official checkpoint names (`embed.weight`, `layers.3.attn.wq_a.weight`,
`hc_head_fn`, `mtp.0.e_proj.weight`, ...). Weights are held dequantised in the model dtype; the fp32
parameters of the reference (mHC, attn_sink, ape, gate bias) in the accumulation dtype.

Numerics (`numerics=`; full detail in docs/numerics.md):
* "reference" (default) simulates DeepSeek's inference code:
  - KV: the nope dims of every window kv (all layers, MTP too) and every compressed entry are
    FP8-e4m3 quantised/dequantised in blocks of 64 with pow2 scales, after norm and RoPE;
  - indexer: queries and keys are Hadamard-rotated and FP4-e2m1 simulated in blocks of 32;
  - activations: the input of every FP8/FP4-weight linear except wo_a (wq_a, wq_b, wkv, wo_b,
    indexer.wq_b, experts, mtp e_proj/h_proj) is FP8-quantised per token per 128 channels.
* "transformers": none of the three (what transformers 5.23.0 computes when loaded dequantised).
* The model dtype sets where the rest rounds: the reference's bf16 rounding points round to the
  model dtype; its fp32 computations and all GEMM accumulation run in fp32 for a bfloat16 model
  (the reference precision map) and in float64 for float32/float64 models. Float64 accumulation
  makes a float32 model's results independent of batch composition and chunking (fp32 summation
  order would flip FP8/FP4 roundings); it is the exactness baseline.
* Ties in the indexer's and the router's top-k go to the lowest index.

Kernels (`kernels=`): "torch" (default on CPU) is the reference path above. "triton" (bf16 model on
CUDA, one process or sharded) keeps the FP8 linear weights quantised and runs them through
`dsv4.kernels.fp8_linear`, and runs the routed experts through `dsv4.kernels.moe.fused_moe` with
MXFP4/FP8 weights kept packed, and the mHC sites and the HC head (+ final norm) through
`dsv4.kernels.mhc`; everything else stays in torch. "auto" picks "triton" when the model
is built on CUDA in bf16 and triton imports, else "torch". Sharded, the row-parallel partial sums
(wo_b, shared w2) leave the FP8 kernel in fp32 and are rounded once after the all-reduce, as in the
torch path (`dsv4.distributed.selfcheck --kernels triton` checks it on GPUs).

Batches are flat: see `dsv4.model.context` for packing sequences and carrying their decode state.

Several processes (`parallel=` a `dsv4.distributed.ParallelState`): every rank runs the same forward
on the same tokens and holds its shards (dsv4.distributed.sharding): vocabulary rows of embed/head,
attention heads, the shared expert's TP slice, its EP rank's routed experts. `load_weights` accepts
full tensors and keeps the rank's slice (other ranks' experts are skipped); `compute_logits` returns
the full logits on every rank. Partial sums cross ranks in the accumulation dtype, so a float32
model gives the single-process results (up to float64 summation order).
"""
from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from dsv4.config import ModelConfig
from dsv4.model.block import Block, run_blocks
from dsv4.model.context import (ForwardContext, Segment, advance_paged, check_token_ids, get_forward_context,
                                paged_step_pools, sequence_spans, to_device)
from dsv4.model.mixed_steps import decode_head_step, split_mixed_step
from dsv4.model.rope import shared_cos_sin
from dsv4.model.hyper import hc_head
from dsv4.model.linear import PLAIN, Linear, bf16_gemm_fp32, dequantize_weight, quantized_weights
from dsv4.model.moe import MoE
from dsv4.model.mtp import MTPBlock
from dsv4.model.norm import RMSNorm
from dsv4.model.numerics import COMPUTE_DTYPES, Numerics, acc_dtype, resolve_numerics
from dsv4.model.state import SequenceState

STORED_QUANT_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)
KERNELS = ("auto", "torch", "triton")


def resolve_kernels(kernels: str, dtype: torch.dtype, device: torch.device) -> str:
    """"auto" -> "triton" on CUDA for a bf16 model when triton imports, else "torch". "triton" also on the CPU
    under Triton's interpreter (TRITON_INTERPRET=1: the kernel path's tests without a GPU, slowly)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r}; allowed: {', '.join(KERNELS)}")
    from dsv4.kernels._triton import HAS_TRITON, INTERPRET
    usable = (device.type == "cuda" or INTERPRET and kernels == "triton") and HAS_TRITON and dtype == torch.bfloat16
    if kernels == "auto":
        return "triton" if usable else "torch"
    if kernels == "triton" and not usable:
        raise ValueError(f"kernels='triton' needs a bf16 model on CUDA and triton installed "
                         f"(got dtype={dtype}, device={device}, triton={'yes' if HAS_TRITON else 'no'})")
    return kernels


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype, layout=None):
        super().__init__()
        self.vocab_size, self.layout = vocab_size, layout
        rows = layout.vocab if layout is not None else vocab_size
        self.weight = nn.Parameter(torch.empty(rows, dim, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor, validate: bool = True) -> torch.Tensor:
        """validate=False: the caller checked the ids' range already (no host sync; graph capture)."""
        if ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 1:
            raise ValueError(f"token ids must be a 1-D int tensor, got {ids.dtype} {tuple(ids.shape)}")
        if validate and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"token id out of range [0, {self.vocab_size}): "
                             f"min {int(ids.min())}, max {int(ids.max())}")
        if self.layout is None:
            return F.embedding(ids, self.weight)
        # vocab-parallel: the rank holding a token's row contributes it, the others zeros (exact sum)
        local = ids - self.layout.vocab_start
        mine = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight).masked_fill(~mine[:, None], 0)
        return self.layout.ps.reduce_tp(rows)


def lm_head(hidden: torch.Tensor, head: Linear, layout=None) -> torch.Tensor:
    """Logits in fp32 (fp64 for a float64 model), accumulated in the model's accumulation dtype.
    With a layout, each rank computes its vocabulary rows and all ranks receive the full logits."""
    w = head.weight
    # CUDA bf16: one bf16 GEMM into fp32 reads the 1 GB head, not a 2 GB fp32 copy of it
    logits = bf16_gemm_fp32(hidden.to(w.dtype), w) if w.dtype == torch.bfloat16 else None
    if logits is None:
        logits = F.linear(hidden.to(acc_dtype(w.dtype)), head.acc_weight())
        logits = logits.to(torch.float64 if w.dtype == torch.float64 else torch.float32)
    return logits if layout is None else layout.ps.gather_tp(logits, dim=-1)


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 numerics: str | Numerics = "reference", parallel=None, kernels: str = "auto"):
        """kernels: "auto" | "torch" | "triton" (see the module docstring); the device is the current
        default device (build under `with torch.device("cuda"):`, as `load_model` does)."""
        super().__init__()
        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype={dtype}; allowed: {', '.join(map(str, COMPUTE_DTYPES))}")
        self.config, self.dtype, self.numerics = config, dtype, resolve_numerics(numerics)
        self.kernels = resolve_kernels(kernels, dtype, torch.empty(0).device)
        with quantized_weights(config.expert_dtype) if self.kernels == "triton" else nullcontext():
            self._build(config, dtype, parallel)
        self._loaded: set[str] = set()
        self._head_mix = None  # kernel mode: the HC head's dsv4.kernels.mhc.MixWeight
        self._graphs = None  # dsv4.model.graphs.DecodeGraphs after enable_cuda_graphs()
        self._pending: dict[str, dict[str, torch.Tensor]] = {}  # quantised weight waiting for its pair
        self._finalized = False
        self._mtp_target: torch.Tensor | None = None

    def _build(self, config: ModelConfig, dtype: torch.dtype, parallel) -> None:
        c, acc = config, acc_dtype(dtype)
        self.parallel = parallel
        if parallel is not None:
            from dsv4.distributed.sharding import Layout
            self.layout = Layout.of(c, parallel)
        else:
            self.layout = None
        layout = self.layout
        self.embed = Embedding(c.vocab_size, c.hidden_size, dtype, layout)
        self.layers = nn.ModuleList(Block(c, spec, dtype, self.numerics, layout) for spec in c.layers)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.head = Linear(c.hidden_size, layout.vocab if layout is not None else c.vocab_size, dtype, self.numerics)
        self.hc_head_fn = nn.Parameter(torch.empty(c.hc_mult, c.hc_mult * c.hidden_size, dtype=acc),
                                       requires_grad=False)
        self.hc_head_base = nn.Parameter(torch.empty(c.hc_mult, dtype=acc), requires_grad=False)
        self.hc_head_scale = nn.Parameter(torch.empty(1, dtype=acc), requires_grad=False)
        self.mtp = nn.ModuleList([MTPBlock(c, dtype, self.numerics, self.embed, self.head, layout)]
                                 if c.num_nextn_predict_layers else [])

    # ---- inference API -------------------------------------------------------------------
    def enable_cuda_graphs(self, max_batch: int = 64, capture: bool = True) -> None:
        """Run decode steps (one token per sequence, or the few tokens of a verify step over the paged
        pools; up to max_batch rows, rounded up to a bucket) as CUDA graphs, captured per bucket on first
        use (dsv4.model.graphs). A sharded model graphs the paged steps only, every rank alike; call after
        finalize_weights. `capture=False` runs the same code eagerly (tests)."""
        if not self._finalized:
            raise RuntimeError("enable_cuda_graphs: call finalize_weights() first")
        from dsv4.model.graphs import DecodeGraphs
        self._graphs = DecodeGraphs(self, max_batch, capture)

    def new_sequence_state(self, max_rollback: int = 4) -> SequenceState:
        return SequenceState.create(self.config, self.dtype, self.embed.weight.device, max_rollback)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: object = None, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Flat batch -> hidden states [T, D] (after hc_head and the final norm)."""
        if not self._finalized:
            raise RuntimeError("call finalize_weights() after loading weights, before forward")
        if intermediate_tensors is not None:
            raise ValueError("intermediate_tensors: pipeline parallelism is not supported")
        t = positions.shape[0] if positions.dim() == 1 else -1
        if t < 0 or positions.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"positions must be a 1-D int tensor, got {positions.dtype} {tuple(positions.shape)}")
        if inputs_embeds is not None:
            if inputs_embeds.shape != (t, self.config.hidden_size):
                raise ValueError(f"inputs_embeds must be [{t}, {self.config.hidden_size}], "
                                 f"got {tuple(inputs_embeds.shape)}")
            h = inputs_embeds.to(self.dtype)
            if input_ids is not None and input_ids.shape != (t,):
                raise ValueError(f"input_ids must be [{t}], got {tuple(input_ids.shape)}")
        elif input_ids is None or input_ids.shape != (t,):
            raise ValueError(f"input_ids must be [{t}] (one id per position), got "
                             f"{None if input_ids is None else tuple(input_ids.shape)}")
        else:
            h = None  # embedded below, or inside the decode graph
        if input_ids is None and self.config.num_hash_layers:
            raise ValueError("input_ids are required: hash-routed MoE layers route by token id")
        ctx = get_forward_context() or ForwardContext([t], [self.new_sequence_state()])
        dev = self.embed.weight.device
        if input_ids is not None:  # host ids: checked there, copied without a wait; device ids: see check_token_ids
            input_ids = input_ids.long()
            check_token_ids(input_ids, self.config.vocab_size, "input_ids", ctx.trusted_inputs)
            input_ids = to_device(input_ids, dev)
        positions = positions.long()
        for s in ctx.states:
            if s.dtype != self.dtype or len(s.layers) != len(self.layers):
                raise ValueError(f"SequenceState ({s.dtype}, {len(s.layers)} layers) does not belong to this "
                                 f"model ({self.dtype}, {len(self.layers)} layers); use model.new_sequence_state()")
        spans = sequence_spans(ctx, positions, [s.num_tokens for s in ctx.states])

        # a mixed step in one pass (mixed_steps.ONE_PASS_MIXED_STEPS): the rows of its first `decode_head` sequences
        # are decode rows, which attend as one fixed-shape step (`head_step`), not as segments
        head = ctx.decode_head

        def segments(i: int) -> list[Segment]:
            return [Segment(start, n, s.layers[i]) for (start, n), s in zip(spans[head:], ctx.states[head:]) if n]

        head_step = decode_head_step(self, ctx) if head else None
        if not head and self._graphs is not None and inputs_embeds is None:  # decode rows beside chunks: split
            hidden = split_mixed_step(self, input_ids, positions, ctx, spans)
            if hidden is not None:
                return hidden
        pools = paged_step_pools(ctx)
        lens = [int(n) for n in ctx.seq_lens]
        step = None
        if pools is not None and self._graphs is not None and inputs_embeds is None and t <= self._graphs.max_batch:
            # short rows over the engine's pools: one fixed-shape step, one graph (positions from the states)
            hidden = self._graphs.paged_step(pools, input_ids, ctx.states, lens)
            self._mtp_target = self._graphs.last_streams(t).flatten(1)
            advance_paged(ctx.states, lens)
            return hidden
        positions = to_device(positions, dev)
        if pools is not None:  # the same fixed-shape step, eagerly
            step = pools.decode_step(t, max(s.num_tokens + n for s, n in zip(ctx.states, lens)))
            step.fill(ctx.states, lens)
            step.derive()
        elif self._graphs is not None and inputs_embeds is None and self._graphs.handles(ctx.seq_lens):
            hidden = self._graphs.step(input_ids, positions, segments)
            self._mtp_target = self._graphs.last_streams(t).flatten(1)
            return hidden
        elif self._graphs is not None and inputs_embeds is None and self._graphs.handles_prefill(ctx.seq_lens):
            # a short prefill (any mix of chunks): stateless parts as graphs, attention eager (prefill_graphs)
            hidden = self._graphs.prefill(input_ids, positions, segments, head_step)
            if hidden is not None:  # (None: its bucket did not fit in GPU memory; the eager forward below)
                self._mtp_target = self._graphs.last_streams(t).flatten(1)
                if head_step is not None:
                    advance_paged(ctx.states[:head], lens[:head])
                return hidden
        if h is None:
            h = self.embed(input_ids, validate=False)  # range checked above (or trusted)
        x = h.unsqueeze(1).expand(-1, self.config.hc_mult, -1).contiguous()
        with shared_cos_sin():
            x = run_blocks(self.layers, x, input_ids, positions, (lambda i: None) if step else segments, step,
                           head_step)
        if step is not None:
            advance_paged(ctx.states, lens)
        elif head_step is not None:
            advance_paged(ctx.states[:head], lens[:head])
        self._mtp_target = x.flatten(1)
        return self.final_hidden(x)

    def final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """HC head + final norm: residual streams [T, hc, D] -> hidden [T, D]."""
        if self._head_mix is not None:  # kernel mode: HC head + final norm in two launches
            from dsv4.kernels.mhc import hc_head as hc_head_kernel
            return hc_head_kernel(x, self._head_mix, self.hc_head_base, self.hc_head_scale,
                                  hc_eps=self.config.hc_eps, norm_eps=self.config.rms_norm_eps,
                                  norm_weight=self.norm.weight)
        y = hc_head(x, self.hc_head_fn, self.hc_head_base, self.hc_head_scale,
                    hc_eps=self.config.hc_eps, norm_eps=self.config.rms_norm_eps)
        return self.norm(y)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """head(hidden): fp32 logits [T, V] (float64 for a float64 model)."""
        if hidden.dim() != 2 or hidden.shape[1] != self.config.hidden_size:
            raise ValueError(f"hidden must be [T, {self.config.hidden_size}], got {tuple(hidden.shape)}")
        return lm_head(hidden, self.head, self.layout)

    def get_mtp_target_hidden_states(self) -> torch.Tensor:
        """Residual streams before hc_head of the last forward, [T, hc_mult * D] (MTP input)."""
        if self._mtp_target is None:
            raise RuntimeError("no forward has run yet")
        return self._mtp_target

    def forward_mtp(self, prev_residual: torch.Tensor, next_token_ids: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP block: -> (its residual [T, hc*D], hidden [T, D]); see `MTPBlock.forward`."""
        if not self.mtp:
            raise RuntimeError("this config has no MTP block (num_nextn_predict_layers = 0)")
        return self.mtp[0](prev_residual, next_token_ids, positions, graphs=self._graphs)

    # ---- weights -------------------------------------------------------------------------
    def get_expert_mapping(self) -> list[tuple[str, str, int, str]]:
        """vLLM FusedMoE-style mapping `(param_prefix, checkpoint_prefix, expert_id, shard)`, e.g.
        ("experts.w13_", "experts.5.w1.", 5, "w1"): w1/w3 fill the two halves of a fused w13, w2 is w2.
        Only the experts this rank holds are listed (all of them in one process); `load_model` reads
        exactly the routed-expert tensors named here."""
        experts = self.layout.experts if self.layout is not None else range(self.config.n_routed_experts)
        return [("experts.w13_" if shard in ("w1", "w3") else "experts.w2_", f"experts.{e}.{shard}.", e, shard)
                for e in experts for shard in ("w1", "w2", "w3")]

    def _targets(self) -> dict[str, torch.Tensor]:
        return dict(self.named_parameters()) | dict(self.named_buffers())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load backbone tensors (official names; `mtp.*` are skipped). Accepts quantised tensors as
        stored (FP8 + `.scale`, packed MXFP4 + `.scale`) or unquantised masters; returns the names of
        the parameters completed by this call. Sharded: full tensors in, this rank's slice kept;
        routed experts of other ranks are skipped."""
        return self._load(weights, mtp=False)

    def load_mtp_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the `mtp.0.*` tensors (other names are skipped)."""
        return self._load(weights, mtp=True)

    def _load(self, weights: Iterable[tuple[str, torch.Tensor]], mtp: bool) -> set[str]:
        targets = self._targets()
        linears = {f"{n}.weight": m for n, m in self.named_modules() if isinstance(m, Linear)}
        done: set[str] = set()
        layout = self.layout
        for name, tensor in weights:
            if name.startswith("mtp.") != mtp:
                continue
            if mtp and ("emb" in name or name.endswith("head.weight")):
                continue  # DeepSeek's converter drops MTP copies of embed/head too
            if layout is not None and not layout.owns(name):
                continue  # a routed expert of another EP rank
            if name.endswith(".scale"):
                wname = name[: -len(".scale")] + ".weight"
                if wname not in linears or linears[wname].weight_format == PLAIN:
                    raise ValueError(f"{name}: unexpected scale tensor (no quantised weight {wname} in this model)")
                self._pending.setdefault(wname, {})["scale"] = tensor
            elif name not in targets:
                raise ValueError(f"{name}: unexpected tensor (not a parameter of a model with this config)")
            elif tensor.dtype in STORED_QUANT_DTYPES and name in linears:
                if linears[name].weight_format == PLAIN:
                    raise ValueError(f"{name}: stored as {tensor.dtype}, but this weight is never quantised")
                self._pending.setdefault(name, {})["weight"] = tensor
                wname = name
            elif name in linears and linears[name].kernel_format is not None:  # a master, quantised here
                if layout is not None:
                    from dsv4.distributed.sharding import take
                    tensor = take(name, tensor, layout.cut(name))
                linears[name].load_master(name, tensor)
                done |= {name, name[: -len(".weight")] + ".scale"}
                continue
            else:
                if layout is not None:
                    from dsv4.distributed.sharding import take
                    tensor = take(name, tensor, layout.cut(name))
                self._copy(name, targets[name], tensor)
                done.add(name)
                continue
            pair = self._pending[wname]
            if len(pair) == 2:
                lin = linears[wname]
                qw, qs = pair["weight"], pair["scale"]
                if layout is not None:
                    from dsv4.distributed.sharding import take_fp8_pair
                    qw, qs = take_fp8_pair(wname, qw, qs, layout.cut(wname))
                if lin.kernel_format is not None:  # kernel mode: kept as stored
                    lin.load_quantized(wname, qw, qs)
                    done.add(wname[: -len(".weight")] + ".scale")
                else:
                    w = dequantize_weight(wname, qw, qs.to(qw.device), lin.weight_format, torch.float32)
                    self._copy(wname, lin.weight, w)
                del self._pending[wname]
                done.add(wname)
        self._loaded |= done
        self._finalized = False
        return done

    def load_random_weights(self, seed: int = 0) -> None:
        """Random weights of the checkpoint's formats and magnitudes, made in place on the model's
        device (full-size benchmarks, no disk; see dsv4.model.synthetic), then `finalize_weights`."""
        from dsv4.model.synthetic import fill_random_weights
        self._pending.clear()
        self._loaded |= fill_random_weights(self, seed)
        self.finalize_weights()

    def _copy(self, name: str, target: torch.Tensor, tensor: torch.Tensor) -> None:
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        if target.dtype == torch.int64:
            if tensor.is_floating_point():
                raise ValueError(f"{name}: expected an integer tensor, got {tensor.dtype}")
            if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= self.config.n_routed_experts):
                raise ValueError(f"{name}: expert ids outside [0, {self.config.n_routed_experts})")
        elif not tensor.is_floating_point() or tensor.dtype in STORED_QUANT_DTYPES:
            raise ValueError(f"{name}: expected a bf16/f16/f32/f64 tensor, got {tensor.dtype}")
        with torch.no_grad():
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        owner = self.get_submodule(name.rsplit(".", 1)[0]) if "." in name else self
        if isinstance(owner, Linear):
            owner.invalidate_cache()

    def finalize_weights(self) -> None:
        """Check that every tensor arrived (MTP: all or none) and is finite; enable forward."""
        if self._pending:
            half = {n: sorted(p) for n, p in list(self._pending.items())[:8]}
            raise ValueError(f"{len(self._pending)} quantised weights lack their pair (have: {half})")
        targets = self._targets()
        backbone = {n for n in targets if not n.startswith("mtp.")}
        mtp = set(targets) - backbone
        for names, what in ((backbone - self._loaded, "backbone"),
                            (mtp - self._loaded if mtp & self._loaded else set(), "MTP")):
            if names:
                raise ValueError(f"missing {len(names)} {what} tensors, e.g. {sorted(names)[:8]}")
        for name in sorted(self._loaded):
            t = targets[name]
            if t.is_floating_point() and t.dtype not in STORED_QUANT_DTYPES and not torch.isfinite(t).all():
                raise ValueError(f"{name}: contains NaN or infinity after loading")
        targets = t = None  # packing below frees the per-expert tensors: hold no references to them
        if self.mtp:
            self.mtp[0].ready = bool(mtp) and mtp <= self._loaded
        if self.kernels == "triton":  # an unloaded MTP block keeps its (empty) experts unpacked
            blocks = list(self.layers) + [m for m in self.mtp if m.ready]
            for m in (m for b in blocks for m in b.modules()):
                if isinstance(m, MoE):
                    m.pack_experts()
            if self.config.hc_mult == 4:  # the mHC kernels name four streams
                from dsv4.kernels.mhc import prepare_mix
                for b in blocks:
                    b.use_mhc_kernels()
            for b in blocks:
                b.attn.fuse_fp8_pairs()  # wq_a | wkv and wq_b | indexer.wq_b as one FP8 weight each
                if b.attn.compressor:  # the bf16 linears of the attention input likewise, here, not in a forward
                    b.attn.fused_input_weight()
                b.attn.use_kernels = True
                b.ffn.gate.use_kernels = True
                if b.attn.indexer:
                    b.attn.indexer.use_kernels = True
            if self.config.hc_mult == 4:  # the HC head kernel likewise (else the torch HC head)
                self._head_mix = prepare_mix(self.hc_head_fn)
        self._finalized = True
        if self._graphs is not None:  # graphs captured from the old weights are dropped (their limits kept)
            old = self._graphs
            self.enable_cuda_graphs(old.max_batch, old.capture)
            self._graphs.prefill_limit = old.prefill_limit
