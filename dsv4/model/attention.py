"""Attention of one layer (spec §2.3-2.5): q LoRA, one shared K=V head, sliding window plus
compressed entries in one softmax with a per-head sink, inverse RoPE, grouped output projection.

Query t attends to the window kv of positions max(0, t-127) .. t and to the compressed entries in its
candidate set: none (sliding-only), all complete entries j < floor((t+1)/128) (HCA), or the indexer's
selection among j < floor((t+1)/4) (CSA). Scores are `q.k * head_dim^-0.5`; the sink logit of head h
joins the softmax denominator only. Projections, norms and RoPE run on the flat batch; the attention
itself runs per sequence (vectorised over that sequence's tokens in blocks of queries), or, for short
rows over the engine's paged pools, as one fixed-shape step over all rows (`_attend_step`).

Sharded (`layout` given): this rank computes heads [h0, h0 + H/tp) = output groups [g0, g0 + G/tp)
(wq_b rows, attn_sink, wo_a rows, wo_b input columns); wo_b's partial sums are all-reduced over the
TP group in the accumulation dtype and rounded once, as one process does. The q latent, the shared
K=V head, the compressors and the indexer are replicated (every head needs all of them).

Kernel mode stacks the linears that share an input into one GEMM each (dsv4.model.attention_stacks).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

from dsv4.config import LayerSpec, ModelConfig
from dsv4.model.compressor import Compressor
from dsv4.model.context import Segment
from dsv4.model.indexer import Indexer, indices_to_mask
from dsv4.model.attention_stacks import StackedProjections
from dsv4.model.attention_unpaged import UnpagedDecode
from dsv4.model.linear import FP8, FP8Stack, Linear
from dsv4.model.mixed_steps import attend_head
from dsv4.model.norm import RMSNorm, unweighted_rms_norm
from dsv4.model.numerics import Numerics, acc_dtype, simulate_kv_fp8
from dsv4.model.rope import RotaryEmbedding, apply_rope
from dsv4.model.side_stream import start_beside
from dsv4.model.sink_attention import sink_attention, sink_attention_decode

W8A16_MAX_TOKENS = 64  # kernel mode: wo_a from the FP8 weight up to here (decode), cuBLAS on bf16 above
# kernel mode, paged decode step and prefill chunks: the attention kernel applies the inverse RoPE to its output
# (one launch fewer per layer than `norm_rope` in `finish`; same bits, tests/gpu/test_attention.py and
# test_prefill_attention.py)
KERNEL_INVERSE_ROPE = True
# kernel mode, prefill chunks over paged FP8 pools: the window kv and the compressor's entries (its finish included)
# stored by one `cache_store.store_rows` launch each, as the paged decode step stores them, instead of ~12-40 torch
# ops (Compressor.update(fused=), PagedLayerState.append_tokens(fused=))
FUSED_PREFILL_STORES = True
# the same chunks' reads of the window and of the entries from paged FP8 / FP4 pools by one `cache_store.load_rows`
# launch each instead of ≈ 16 torch ops (the same bits). H200 s30a, 8K forward of 4 Flash layers, with the two
# below and compressor.FUSED_POOL: kernels 804 -> 733, GPU 50.3 -> 49.9 ms, wall 54.1/55.5 -> 51.3/51.8 ms
FUSED_PREFILL_READS = True
# HCA chunks: the prefill kernel walks every complete entry itself (`causal_ratio`) instead of reading a [T, N] list
# built by ≈ 6 torch ops; the same bits (GPU-tested s30a)
PREFILL_HCA_CAUSAL = True
# kernel mode: the q latent's norm and the window kv's norm + RoPE + FP8 simulation in one launch, and on CSA layers
# the q heads' norm + RoPE with the indexer q's RoPE + Hadamard + FP4 simulation (`norm_rope.norm_rope_two`): one
# or two launches fewer per layer in a decode step (session 31, H200: 272 -> 261 kernels per 8-layer eager step,
# graph replay 1.26 -> 1.25 ms at B=1, 3.13-3.16 -> 3.14 at B=8; run_device_s31c.sh). The second pairing only up
# to PAIRED_QUERIES_MAX_T tokens: its kernel takes the indexer part's 225 registers for every program (sm_90a), too
# few programs per SM for the q heads' [T * H, 512] pass of a long prefill
PAIRED_NORMS = True
PAIRED_QUERIES_MAX_T = 64
# kernel mode, above PAIRED_QUERIES_MAX_T tokens: the q heads' norm + RoPE left to the prefill attention kernel,
# which applies them to Q in shared memory (`prefill_attention(q_norm=)`), instead of a `norm_rope` launch that
# reads and writes [T, H, Dh] once more (8K Flash tokens: 2 x 537 MB per layer). Paths that take normed q
# (decode kernels, the torch attention) get it from `norm_rope` in `attend` (`_normed_q`). H200 s37d, 4 Flash layers,
# one 8K prefill, µs of GPU: attention 4258 -> 4753, norm_rope 1205 -> 177, the forward 44682 -> 44162 (-1.2 %)
PREFILL_Q_NORM_IN_KERNEL = True
# kernel mode, paged FP8 decode step: the token's window kv stored into the pool by the q latent + kv norm launch
# (`norm_rope_two(store_b=)`, the same bytes as `cache_store.store_rows` of its output) instead of a launch of its
# own before the attention: one launch fewer per layer. H200 s50, 8 Flash layers, B = 1 replay: with the next two
# 1.13 / 1.13 -> 1.08 / 1.08 ms (alone 1.12)
FUSED_KV_STORE = True
# kernel mode, paged FP8 decode step on layers without an indexer (sliding, HCA): the q heads' norm + RoPE applied by
# the decode attention kernel as it loads q (`decode_attention(q_norm=)`) instead of a `norm_rope` launch: one launch
# fewer per such layer (CSA layers pair it with the indexer q's glue already). H200 s50: alone within noise (B = 1
# 1.13 ms), with the other two above
DECODE_Q_NORM_IN_KERNEL = True
# (Removed after session 84: the q latent's norm by wq_b's GEMM, the kv's beside -- no gain on the H100, 8 Flash
# layers' replay B = 1 1.14 / 1.16 -> 1.16 / 1.16 ms, B = 8 3.04 -> 3.05; docs/benchmarks.md "Session 84")
# kernel mode, paged FP8 decode step: each compressor's new entry (normed, RoPE'd, quantised) stored by the pooling
# launch's last-arriving program per row (`cache_store.pool_windows(store=)`) instead of a `store_rows` launch after
# it: one launch fewer per compressor (CSA layers 2, HCA 1). Bit-identical on the H200 (s50g, after the verify-step
# race fix in `pool_windows(back=)`), but no faster with COMPRESS_BESIDE (the launch it saves is off the main stream):
# 8 Flash layers B = 1 replay off / on / off / on 1.08 / 1.08 / 1.07 / 1.08 ms. Opt-in
FUSED_ENTRY_STORE = False
# kernel mode, paged FP8 decode step: the compressors' step work (rows stored, window pooled, entry stored) queued
# on the side stream after the projections that produce its rows (`side_stream`, "projections"), beside the query
# path, instead of on the main stream in `attend`: off the B = 1 critical path. Every slot and cos / sin is derived
# on the main stream before the fork (the branch allocates nothing the main stream reads). H200 s50: alone B = 1
# 1.13 -> 1.09 ms (8 Flash layers), with the two above 1.08
COMPRESS_BESIDE = True
# kernel mode, paged FP8 decode step of a CSA layer with COMPRESS_BESIDE: the indexer's chain (its wq_b, the queries'
# RoPE / Hadamard / FP4 launch, then scores and top-k once the projections' branch has stored the step's key entry)
# queued on a side stream of its own (`side_stream`, "indexer") beside the attention's wq_b, whose q the decode
# attention kernel norms (as DECODE_Q_NORM_IN_KERNEL); the attention joins it. Off: the chain after wq_b on the main
# stream (s52 timeline, B = 1 ctx 4K: wq_b end -> top-k end ≈ 33 µs of a CSA layer's ≈ 136). On since s54: with
# STEP_TABLES_BESIDE and the side lanes' high priority, 8 Flash layers' B = 1 replay 1.05 -> 1.02 ms, three A/B pairs
INDEXER_BESIDE = True


def _decode_shaped(segments: list[Segment] | None) -> bool:
    """One token per sequence in rows 0..B-1 (B > 1): `attend` batches them (`_attend_decode`)."""
    return segments is not None and len(segments) > 1 and all(
        seg.length == 1 and seg.start == i for i, seg in enumerate(segments))


class AttentionInputs(NamedTuple):
    """What `Attention.prepare` computes per token for `attend` and `finish`."""
    q: torch.Tensor                      # [T, H, Dh] normed, RoPE'd
    kv: torch.Tensor                     # [T, Dh] the shared K=V head (FP8-simulated nope dims)
    cos: torch.Tensor                    # [T, rope_dim/2]
    sin: torch.Tensor
    rows: tuple | None                   # main compressor rows (C, Z) fp32
    index_rows: tuple | None             # indexer compressor rows
    index_q: torch.Tensor | None         # [T, Hi, di]
    index_w: torch.Tensor | None         # [T, Hi]
    dtype: torch.dtype
    q_norm_eps: float | None = None      # q not normed / RoPE'd yet (*_Q_NORM_IN_KERNEL): the norm's eps
    kv_stored: bool = False              # kv already in the paged step's window pool (FUSED_KV_STORE)
    compressed: bool = False             # the step's compressor work done beside the query path (COMPRESS_BESIDE)
    picks: Callable | None = None        # INDEXER_BESIDE: the join of the indexer's branch -> (picked, kept alive)


class Attention(StackedProjections, UnpagedDecode, nn.Module):
    def __init__(self, config: ModelConfig, spec: LayerSpec, dtype: torch.dtype, numerics: Numerics,
                 layout=None):
        super().__init__()
        c = config
        self.layout = layout
        self.layer_index = spec.index
        self.use_kernels = False  # kernel mode: fused glue (dsv4.kernels.norm_rope), cache stores, decode attention
        heads, groups = (layout.heads, layout.groups) if layout is not None else (c.num_heads, c.o_groups)
        self.n_heads, self.head_dim, self.rope_dim = heads, c.head_dim, c.rope_dim
        self.nope_dim = c.head_dim - c.rope_dim
        self.groups, self.group_rank = groups, c.o_lora_rank
        self.window = c.window
        self.eps = c.rms_norm_eps
        self.scale = c.head_dim ** -0.5
        self.numerics = numerics
        self.rope = RotaryEmbedding(c.rope_dim, spec.rope, acc_dtype(dtype))
        self.attn_sink = nn.Parameter(torch.empty(heads, dtype=acc_dtype(dtype)), requires_grad=False)
        self.wq_a = Linear(c.hidden_size, c.q_lora_rank, dtype, numerics, FP8)
        self.q_norm = RMSNorm(c.q_lora_rank, c.rms_norm_eps, dtype)
        self.wq_b = Linear(c.q_lora_rank, heads * c.head_dim, dtype, numerics, FP8)
        self.wkv = Linear(c.hidden_size, c.head_dim, dtype, numerics, FP8)
        self.kv_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype)
        # wo_a: FP8 in the checkpoint, but a bf16 einsum without activation quantisation in the reference.
        self.wo_a = Linear(c.num_heads * c.head_dim // c.o_groups, groups * c.o_lora_rank, dtype,
                           numerics, FP8, quantize_input=False)
        self.wo_b = Linear(groups * c.o_lora_rank, c.hidden_size, dtype, numerics, FP8)
        self.compressor = Compressor(c, spec.compress_ratio, c.head_dim, self.rope, dtype, numerics, "main") \
            if spec.has_compressor else None
        self.indexer = Indexer(c, self.rope, dtype, numerics) if spec.has_indexer else None
        self._fused: tuple[torch.Tensor, list[int]] | None = None  # kernel mode: see fused_input_weight
        self._fp8_stacks: dict[str, FP8Stack] = {}  # kernel mode: see fuse_fp8_pairs

    def forward(self, a: torch.Tensor, positions: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        """a: attention input (after attn_norm) [T, D] of the flat batch -> output [T, D]."""
        pre = self.prepare(a, positions)
        return self.finish(self.attend(pre, positions, segments), pre)

    # A forward is prepare (per token, no state) -> attend (per sequence, reads/writes the state) ->
    # finish (per token). Decode under CUDA graphs (dsv4.model.graphs) captures prepare and finish
    # and runs attend eagerly between them.

    def prepare(self, a: torch.Tensor, positions: torch.Tensor, step=None) -> AttentionInputs:
        """Projections, norms, RoPE and the compressor/indexer rows of the flat batch (`step`: the paged decode
        step `attend` will get, whose window slots the kv may be stored into here: FUSED_KV_STORE)."""
        cos, sin = self.rope.cos_sin(positions)
        projected = None  # kernel mode: the compressor / indexer projections beside the query path
        picks = None  # INDEXER_BESIDE: the indexer's chain beside wq_b
        q_norm_eps = None
        kv_stored = False
        compress = None  # (COMPRESS_BESIDE: the compressors' step work, its operands derived here)
        if self.compressor and self.use_kernels:
            if COMPRESS_BESIDE and step is not None and self._fused_step_stores(step):
                compress = [self._compress_step_operands(comp, step) for comp in self._compressors()]
            projected = start_beside(a.device, "projections", a.shape[0], self._project_and_compress,
                                     a, positions, compress)
        a_in = self.wq_a.prepare_input(a)  # shared by wq_a and wkv
        if self.use_kernels:  # the same steps, one launch per tensor
            from dsv4.kernels import norm_rope as nr
            q_latent, kv = self._fp8_pair("a", a_in)
            sim = nr.SIM_FP8 if self.numerics.simulate_kv_fp8 else nr.SIM_NONE
            q_latent_kw = dict(norm=nr.WEIGHTED, weight=self.q_norm.weight, eps=self.q_norm.eps)
            kv_kw = dict(norm=nr.WEIGHTED, weight=self.kv_norm.weight, eps=self.kv_norm.eps, cos=cos, sin=sin, sim=sim,
                         nope=self.nope_dim)
            if PAIRED_NORMS:
                store = (*step.kv_slot(), step.pools.window[self.layer_index]) if self._stores_kv(step) else None
                q_latent, kv = nr.norm_rope_two(q_latent, q_latent_kw, kv, kv_kw, store_b=store)
                kv_stored = store is not None
            else:
                q_latent, kv = nr.norm_rope(q_latent, **q_latent_kw), nr.norm_rope(kv, **kv_kw)
            q_latent_in = self.wq_b.prepare_input(q_latent)
            if self._picks_beside(step, compress):  # the indexer's chain beside wq_b
                picks = start_beside(a.device, "indexer", a.shape[0], self._pick_beside, q_latent_in, cos, sin,
                                     projected, step)
                q, index_proj = self.wq_b(q_latent_in, input_ready=True), None
            elif self.indexer:  # wq_b and the indexer's wq_b read the same q latent
                q, index_proj = self._fp8_pair("q_latent", q_latent_in)
            else:
                q, index_proj = self.wq_b(q_latent_in, input_ready=True), None
            q_kw = dict(norm=nr.UNWEIGHTED, eps=self.eps, cos=cos, sin=sin)
            q = q.unflatten(-1, (self.n_heads, self.head_dim))
            index_ready = None
            if PAIRED_NORMS and index_proj is not None and q.shape[0] <= PAIRED_QUERIES_MAX_T:  # (the same GEMM)
                q, index_ready = nr.norm_rope_two(q, q_kw, *self.indexer.query_glue(index_proj, cos, sin))
            elif PREFILL_Q_NORM_IN_KERNEL and q.shape[0] > PAIRED_QUERIES_MAX_T \
                    or self._step_norms_q(step, picks is not None):
                q_norm_eps = self.eps  # (`attend`)
            else:
                q = nr.norm_rope(q, **q_kw)
        else:
            q_latent = self.q_norm(self.wq_a(a_in, input_ready=True))
            q_latent_in = self.wq_b.prepare_input(q_latent)  # shared by wq_b and indexer.wq_b
            q = self.wq_b(q_latent_in, input_ready=True).unflatten(-1, (self.n_heads, self.head_dim))
            q = apply_rope(unweighted_rms_norm(q, self.eps), cos[:, None], sin[:, None])
            kv = apply_rope(self.kv_norm(self.wkv(a_in, input_ready=True)), cos, sin)
            if self.numerics.simulate_kv_fp8:
                kv = simulate_kv_fp8(kv, self.nope_dim)
            index_proj = index_ready = None
        rows = index_rows = index_q = index_w = None
        if projected is not None:  # one GEMM + one launch instead of ~5 per linear
            rows, index_rows, index_w = projected()
        elif self.compressor:
            rows = self.compressor.project(a, positions)
            if self.indexer:
                index_rows = self.indexer.compressor.project(a, positions)
        if self.indexer and picks is None:
            index_q, index_w = self.indexer.queries(q_latent_in, a, cos, sin, weights=index_w, q=index_proj,
                                                    ready=index_ready)
        return AttentionInputs(q, kv, cos, sin, rows, index_rows, index_q, index_w, a.dtype, q_norm_eps, kv_stored,
                               compress is not None, picks)

    def _picks_beside(self, step, compress: list | None) -> bool:
        """Whether this step's indexer chain runs beside wq_b (INDEXER_BESIDE): a paged decode step whose attention
        kernel reads the picks and whose compressors' work (the key entry the scores read) is in the projections'
        branch, which the chain then waits for."""
        return INDEXER_BESIDE and self.indexer is not None and compress is not None and self.step_kernel(step)

    def _pick_beside(self, q_latent_in: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, projected: Callable,
                     step) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer's branch of a paged decode step: its wq_b and the queries' launch (beside the projections'
        branch), then, joined to that branch (the step's key entry stored, the head weights), scores and top-k.
        The key slots are derived here on the step's first use, off the main stream (only this lane's later branches
        read them, in its stream order; or found already derived by STEP_TABLES_BESIDE's branch, which the main stream
        joined before this fork). Returns (the attention kernel's picks, q_latent_in: read here, kept alive until the
        attention's join)."""
        index_q = self.indexer.kernel_queries(q_latent_in, cos, sin)
        slots = step.entry_read_slots(self.layer_index, "index")
        index_w = projected()[2]
        return self.indexer.pick_from_pool(index_q, index_w, *slots), q_latent_in

    def step_tables(self, positions: torch.Tensor, step) -> list:
        """What this layer's paged decode step derives on first use (kept for the step by `shared_cos_sin` and the
        `DecodeStep`; later layers of its kind find them there), derived now, in the order it would: cos / sin of its
        RoPE, the window slot of the kv, per compressor its step operands (kernel mode), the indexer's key slots, the
        complete-entry count. For block.STEP_TABLES_BESIDE."""
        tables = [self.rope.cos_sin(positions), step.kv_slot()]
        if not (self.use_kernels and self._fused_step_stores(step)):
            return tables
        tables += [self._compress_step_operands(comp, step) for comp in self._compressors()]
        if self.indexer:
            tables.append(step.entry_read_slots(self.layer_index, "index"))
        elif self.compressor:
            tables.append(step.entry_count(self.compressor.ratio))
        return tables

    def _compressors(self) -> list:
        """The layer's compressors, in `AttentionInputs` order: main, then the indexer's."""
        return [c for c in (self.compressor, self.indexer and self.indexer.compressor) if c]

    def _project_and_compress(self, a: torch.Tensor, positions: torch.Tensor, compress: list | None):
        """`_project_fused`, then (COMPRESS_BESIDE) each compressor's step work on its rows: the side branch."""
        rows, index_rows, index_w = self._project_fused(a, positions)
        for operands, comp_rows in zip(compress or [], (rows, index_rows)):
            self._compress_step_launch(operands, comp_rows)
        return rows, index_rows, index_w

    def _normed_q(self, pre: AttentionInputs) -> AttentionInputs:
        """`pre` with q normed and RoPE'd (the launch `prepare` left to the prefill kernel, for other paths)."""
        if pre.q_norm_eps is None:
            return pre
        from dsv4.kernels import norm_rope as nr
        q = nr.norm_rope(pre.q, norm=nr.UNWEIGHTED, eps=pre.q_norm_eps, cos=pre.cos, sin=pre.sin)
        return pre._replace(q=q, q_norm_eps=None)

    def attend(self, pre: AttentionInputs, positions: torch.Tensor, segments: list[Segment] | None,
               out: torch.Tensor | None = None, step=None, rotate: bool = False, head_step=None) -> torch.Tensor:
        """Per sequence: update its state and attend; returns (or fills) [T, H, Dh] before inverse RoPE
        (after it where `rotates` says so: `step`'s kernel, or the prefill kernel when asked with `rotate`).
        `step` (a dsv4.engine.paged_decode.DecodeStep) replaces `segments` for a paged decode batch. `head_step`:
        a mixed step in one forward (dsv4.model.mixed_steps), its rows [0, head_step.size) decode rows attending as
        that step, `segments` the chunks after them."""
        out = torch.empty_like(pre.q) if out is None else out
        if head_step is not None:
            attend_head(self, pre, head_step, out, rotate)
        # kernel mode on CUDA: one Triton launch per sequence over index lists (no [T, N] masks)
        decode = step is None and _decode_shaped(segments)
        kernel = step is None and not decode and self._prefill_kernel(pre)
        if not kernel and not self._step_norms_q(step, pre.picks is not None):
            pre = self._normed_q(pre)
        if step is not None:
            return self._attend_step(pre, step, out)
        if decode:
            return self._attend_decode(pre, segments, out)
        q, kv, rows, index_rows = pre.q, pre.kv, pre.rows, pre.index_rows
        if rotate and not kernel:
            raise ValueError("Attention.attend: rotate=True needs the prefill kernel (see Attention.rotates)")
        fused = kernel and FUSED_PREFILL_STORES
        reads = kernel and FUSED_PREFILL_READS
        for seg in segments:
            sl = slice(seg.start, seg.start + seg.length)
            state, pos = seg.state, positions[sl]
            done = state.num_tokens
            entries = entry_idx = None
            causal = 0  # HCA in kernel mode: the prefill kernel's own entry walk (PREFILL_HCA_CAUSAL)
            new_rows = {}
            if self.compressor:
                self.compressor.update(state, rows[0][sl], rows[1][sl], pre.dtype, fused=fused)
                new_rows["main"] = (rows[0][sl], rows[1][sl])
                entries = state.entries("main", reads)
                if self.indexer:
                    self.indexer.compressor.update(state, index_rows[0][sl], index_rows[1][sl], pre.dtype,
                                                   fused=fused)
                    new_rows["index"] = (index_rows[0][sl], index_rows[1][sl])
                    entry_idx = self.indexer.select_indices(pre.index_q[sl], pre.index_w[sl],
                                                            state.entries("index", reads), pos)
                elif kernel and PREFILL_HCA_CAUSAL:  # HCA: the kernel takes every complete entry itself
                    causal = self.compressor.ratio
                else:  # HCA: every complete entry is visible
                    every = torch.arange(entries.shape[0], device=q.device)[None, :]
                    entry_idx = torch.where(every < ((pos + 1) // self.compressor.ratio)[:, None], every, -1)
            # the window's keys, then the chunk's (kernel mode: one launch; a fresh prompt: the chunk's, no copy)
            keys, past_pos = state.window(reads, tail=kv[sl])
            n_past = past_pos.shape[0]
            if kernel:
                from dsv4.kernels.prefill_attention import prefill_attention
                rot = (pre.cos[sl], pre.sin[sl]) if rotate else (None, None)
                prefill_attention(q[sl], done, keys, done - n_past, self.window, entries, entry_idx,
                                  self.attn_sink, self.scale, *rot, out=out[sl], causal_ratio=causal,
                                  q_norm=None if pre.q_norm_eps is None else (pre.q_norm_eps, pre.cos[sl], pre.sin[sl]))
            else:
                entry_mask = None if entries is None else indices_to_mask(entry_idx, entries.shape[0])
                sink_attention(q[sl], pos, keys, torch.cat((past_pos, pos)), self.window, entries, entry_mask,
                               self.attn_sink, self.scale, first=(done, done - n_past), out=out[sl])
            state.append_tokens(kv[sl], new_rows, fused=fused and self.numerics.simulate_kv_fp8)
        return out

    def _attend_step(self, pre: AttentionInputs, step, out: torch.Tensor, rotate: bool | None = None) -> torch.Tensor:
        """A paged decode step in fixed-shape batch ops (dsv4.engine.paged_decode): write the token's
        kv, rows and (branch-free) entries, then one softmax over window U entries per row (the kernel applies
        the inverse RoPE iff `rotate`, by default KERNEL_INVERSE_ROPE: `step_rotates`)."""
        layer = self.layer_index
        fused = self._fused_step_stores(step)
        if fused and not pre.kv_stored:  # (stored by `prepare` with FUSED_KV_STORE)
            from dsv4.kernels.cache_store import store_rows
            store_rows(pre.kv, *step.kv_slot(), step.pools.window[layer])
        elif not fused:
            step.write_kv(layer, pre.kv)
        for comp, rows in zip(self._compressors(), (pre.rows, pre.index_rows)):
            if fused:  # the rows are stored by the pooling launch (already, beside the query path: `prepare`)
                if not pre.compressed:
                    self._compress_step_launch(self._compress_step_operands(comp, step), rows)
                continue
            step.write_rows(layer, comp.kind, *rows)
            c, z, has_prev = step.window_rows(layer, comp.kind)
            entries = comp.finish_at(comp.pool_window(c, z, has_prev), step.entry_positions(comp.ratio), pre.dtype)
            step.write_entries(layer, comp.kind, entries)
        if self.step_kernel(step):
            picked = None
            if pre.picks is not None:  # the indexer's branch (INDEXER_BESIDE), joined here
                picked = pre.picks()[0]
            elif self.indexer:  # the scores read the FP4 key pool: one launch
                picked = self.indexer.pick_from_pool(pre.index_q, pre.index_w, *step.entry_read_slots(layer, "index"))
            return self._attend_step_kernel(pre, step, picked, out, KERNEL_INVERSE_ROPE if rotate is None else rotate)
        if self.indexer:
            index_keys, present = step.entries(layer, "index")
            picked, valid = self.indexer.pick_padded(pre.index_q, pre.index_w, index_keys, present)
        keys, visible = step.window_keys(layer)
        if self.indexer:
            keys = torch.cat((keys, step.entries_at(layer, "main", picked)), dim=1)
            visible = torch.cat((visible, valid), dim=1)
        elif self.compressor:  # HCA: every complete entry
            entries, present = step.entries(layer, "main")
            keys, visible = torch.cat((keys, entries), dim=1), torch.cat((visible, present), dim=1)
        sink_attention_decode(pre.q, keys, visible, self.attn_sink, self.scale, out)
        return out

    def _compress_step_operands(self, comp, step) -> tuple:
        """What a compressor's step kernels read besides its rows: the state pool's window slots, the entry's slot,
        pool, norm and cos / sin (derived by the step on first use: here, on the stream that calls this), and how
        many rows before each may be the same sequence's (`pool_windows(back=)`)."""
        from dsv4.model.numerics import hadamard_matrix
        layer, name = self.layer_index, comp.kind
        cos, sin = comp.rope.cos_sin(step.entry_positions(comp.ratio))  # shared by the layers (shared_cos_sin)
        had = hadamard_matrix(comp.dim, torch.float32, cos.device) if name == "index" else None
        store = (*step.entry_slot(layer, name), step.pools.entries[layer, name],
                 dict(norm_weight=comp.norm.weight, eps=comp.norm.eps, cos=cos, sin=sin, hadamard=had))
        row_slot = step.row_slot(layer, name)
        back = min(step.pools.max_rollback, row_slot.shape[0] - 1)  # earlier rows of a verify step's sequence
        return comp, step.rows_window(layer, name), row_slot, store, back

    def _compress_step_launch(self, operands: tuple, rows: tuple) -> None:
        """Store the token's (C, Z) rows, pool the window containing t and store its entry: two
        launches (dsv4.kernels.cache_store), one with FUSED_ENTRY_STORE."""
        from dsv4.kernels.cache_store import pool_windows, store_rows
        comp, (buf, page, slots, has_prev), row_slot, store, back = operands
        c, z = (r.to(buf.dtype) for r in rows)
        if c.stride() != z.stride() or c.stride(-1) != 1:  # pool_windows reads both with one stride
            c, z = c.contiguous(), z.contiguous()
        pooled = pool_windows(buf[0], buf[1], page, slots, has_prev, comp.ratio, comp.dim,
                              new_rows=(c, z, row_slot), store=store if FUSED_ENTRY_STORE else None,
                              back=back)
        if not FUSED_ENTRY_STORE:
            store_rows(pooled, *store[:3], **store[3])

    def _fused_step_stores(self, step) -> bool:
        """Whether a paged decode step stores its rows through `cache_store` (FP8 pools, the reference numerics)."""
        return self.use_kernels and step.fp8 and self.numerics.simulate_kv_fp8 and self.numerics.simulate_indexer_fp4

    def _step_norms_q(self, step, picks_beside: bool = False) -> bool:
        """Whether the paged decode step's attention kernel norms and RoPEs q itself (DECODE_Q_NORM_IN_KERNEL): in
        layers without an indexer, and in CSA layers whose indexer chain runs beside (no launch to pair q with)."""
        return DECODE_Q_NORM_IN_KERNEL and (self.indexer is None or picks_beside) and self.step_kernel(step)

    def _stores_kv(self, step) -> bool:
        """Whether `prepare` stores the window kv of this paged decode step (FUSED_KV_STORE)."""
        return FUSED_KV_STORE and step is not None and self._fused_step_stores(step)

    def step_kernel(self, step) -> bool:
        """Whether a paged decode step attends with the Triton kernel."""
        return step is not None and self.use_kernels and step.fp8

    def step_rotates(self, step) -> bool:
        """Whether that kernel also applies the inverse RoPE (`finish` must then skip it)."""
        return KERNEL_INVERSE_ROPE and self.step_kernel(step)

    def _prefill_kernel(self, pre: AttentionInputs) -> bool:
        """Whether `attend` runs sequences' chunks through the Triton prefill kernel."""
        return self.use_kernels and pre.q.is_cuda and pre.q.dtype == torch.bfloat16

    def rotates(self, pre: AttentionInputs, segments: list[Segment] | None, step=None) -> bool:
        """Whether `attend(..., rotate=True)` applies the inverse RoPE itself (`finish(rotated=True)` then skips
        it): the paged decode kernel, or the prefill kernel in its epilogue (one [T, H, Dh] read and write fewer:
        8K Flash prefill, 1.43 ms of GPU time per 4 layers, s29e)."""
        if step is not None:
            return self.step_rotates(step)
        return KERNEL_INVERSE_ROPE and self._prefill_kernel(pre) and not _decode_shaped(segments)

    def _attend_step_kernel(self, pre, step, picked, out, rotate: bool):
        """The Triton kernel reads the FP8 pools itself (the indexer's `picked` entries, -1: none) and writes `out`,
        with `rotate` the inverse RoPE included (rounded to bf16 first, then rotated as `norm_rope(inverse=True)`
        does: the bits `finish` would give)."""
        from dsv4.kernels.attention import decode_attention
        pools, layer = step.pools, self.layer_index
        comp = table = count = None
        if self.compressor:
            r = self.compressor.ratio
            comp, table = pools.entries[layer, "main"], step.tables[f"compressed{r}"]
            if not self.indexer:
                count = step.entry_count(r)
        rot = (pre.cos, pre.sin) if rotate else (None, None)
        q_norm = None if pre.q_norm_eps is None else (pre.q_norm_eps, pre.cos, pre.sin)  # (`_step_norms_q`)
        decode_attention(pre.q, step.pos, *rot, pools.window[layer], step.tables["window"], pools.ring,
                         self.window, comp, table, picked, count, self.attn_sink, self.scale, out=out, q_norm=q_norm)
        return out

    def _wo_a_dense(self, dtype: torch.dtype) -> torch.Tensor:
        """wo_a as [groups, rank, in] in dtype; kernel mode keeps it FP8 ("w8a16"): dequantised here."""
        if self.wo_a.kernel_format == "w8a16" and dtype == torch.bfloat16 and self.wo_a.weight.is_cuda:
            from dsv4.kernels.grouped_w8a16 import dequant_fp8_weight  # one launch
            w = dequant_fp8_weight(self.wo_a.weight, self.wo_a.scale)
        elif self.wo_a.kernel_format == "w8a16":
            from dsv4.quant.fp8 import dequantize_fp8_block
            w = dequantize_fp8_block(self.wo_a.weight, self.wo_a.scale, dtype=dtype)
        else:
            w = self.wo_a.weight if self.wo_a.weight.dtype == dtype else self.wo_a.acc_weight()
        return w.unflatten(0, (self.groups, self.group_rank))

    def finish(self, out: torch.Tensor, pre: AttentionInputs, rotated: bool = False) -> torch.Tensor:
        """Inverse RoPE (unless `rotated`: the decode kernel applied it, `step_rotates`), grouped wo_a,
        wo_b (row-parallel all-reduce when sharded) -> [T, D]."""
        acc = acc_dtype(pre.dtype)
        if self.use_kernels:  # one launch for the inverse RoPE; wo_a: the reference's bf16 products
            from dsv4.kernels.norm_rope import norm_rope
            if not rotated:
                out = norm_rope(out, cos=pre.cos, sin=pre.sin, inverse=True)
            grouped = out.flatten(1).unflatten(-1, (self.groups, -1))
            if self.wo_a.kernel_format == "w8a16" and grouped.shape[0] <= W8A16_MAX_TOKENS:
                from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16  # half the weight bytes
                low_rank = grouped_linear_w8a16(grouped, self.wo_a.weight, self.wo_a.e8m0_scale())
            else:  # prefill: cuBLAS on a transient bf16 copy of the FP8 weight, fp32 acc, bf16 out
                from dsv4.kernels.fp8_linear import grouped_linear_bf16
                low_rank = grouped_linear_bf16(grouped, self._wo_a_dense(pre.dtype).flatten(0, 1))
        else:
            out = apply_rope(out, pre.cos[:, None], -pre.sin[:, None])  # undo the keys' rotation carried by V = K
            grouped = out.flatten(1).unflatten(-1, (self.groups, -1))
            low_rank = torch.einsum("tgi,gri->tgr", grouped.to(acc), self._wo_a_dense(acc)).to(pre.dtype)
        if self.layout is None:
            return self.wo_b(low_rank.flatten(1))
        partial = self.wo_b(low_rank.flatten(1), out_dtype=acc)  # row-parallel: sum over ranks, then round
        return self.layout.ps.reduce_tp(partial).to(pre.dtype)
