"""Decode steps under CUDA graphs (one GPU; over TP/EP ranks the paged whole steps only).

Over the engine's paged pools (the usual case): a fixed-shape step (dsv4.engine.paged_decode; every
sequence brings 1..max_rollback+1 tokens) is captured whole -- embed, every layer including its state
reads/writes and attention, HC head -- as one graph per (row bucket, context bucket) (`_StepBucket`);
the MTP block's draft rows likewise (`_MTPStepBucket`).

Over contiguous per-sequence states (no engine), the step is cut where it touches state:

    piece 0      embed -> layer 0 `pre`                       (captured)
    attend 0     layer 0 attention over each sequence's state (eager: state sizes change every step)
    piece i      layer i-1 `post` -> layer i `pre`            (captured)
    ...
    piece L      layer L-1 `post` -> HC head + final norm     (captured)

(piecewise graphs, `dsv4.model.piecewise`, which short prefills use too). Graphs are captured per batch bucket (1, 2,
4, ... 128; a batch is padded to the next bucket with position 0 / token 0 rows that no sequence reads -- over
paged pools their writes go to the trash pages) the first time a bucket is used. Results equal the eager
kernel-mode model bit for bit at a bucket's exact size (the same kernels on the same rows); a padded
batch may pick another MoE launch shape.

`capture=False` runs the same code eagerly through the same static buffers (CPU tests of the
plumbing). A sharded model (TP/EP ranks in lock-step, dsv4.distributed) graphs the paged whole steps
only: every rank captures the same bucket at the same engine step, its collectives (NCCL) inside the
graph; the piecewise path stays eager there. Capturing that on GPUs is not yet validated (the CPU
tests run the plumbing with `capture=False`), so ranks capture only when `--cuda-graphs` is given (one GPU: by
default, `dsv4.engine.llm_engine.graphs_by_default`). Short prefills run as pieces of their own on one GPU and on
sharded ranks alike (dsv4.model.prefill_graphs).
"""
from __future__ import annotations

import logging

import torch

from dsv4.model.piecewise import MTPPrefillBucket, PiecewiseBucket, StaticArena, capture_graphs, fill_padded
from dsv4.model.prefill_graphs import prefill_bucket_size, prefill_bucket_sizes

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # 128: a verify step of 64 sequences with one draft each
# The paged step graphs (main and MTP, every row and context bucket) capture into one memory pool instead of one
# each. Each pool holds a step's transients: 28 MiB at 1 row to 90 at 32 for Flash, whatever the layers or the
# context (bench/bench_graph_memory.py, H100, session 59), so separate pools add up over the row x context buckets
# used (0.26 GiB per context bucket up to 32 rows). Sharing is safe when graphs never replay at once (one stream)
# and no graph reads pool memory that an earlier replay wrote: every step's outputs are cloned right after its
# replay (`run`, `last_streams`), and a graph recomputes its derived tables first. Session 60 (H100, 8 layers, row
# buckets 1-32): 92 MiB shared against 264 MiB in six pools, the same step time (B = 1 1.599-1.604 ms against 1.602;
# B = 8 3.640-3.643 against 3.641), tokens equal (tests/gpu/test_engine_gpu.py::test_shared_graph_pool_...).
SHARED_POOL = True

log = logging.getLogger(__name__)


def _launch(bucket) -> None:
    """Run a bucket's `_run` eagerly (capture=False) or as its graph, captured on first use."""
    if not bucket.capture:
        bucket._run()
        return
    if not bucket.graphs:
        bucket.graphs = capture_graphs([bucket._run], sharded=bucket.sharded, pool=bucket.pool)
    bucket.graphs[0].replay()


class _StepBucket:
    """A whole decode step over the engine's paged pools as one graph (dsv4.engine.paged_decode):
    the state reads and writes are fixed-shape too, so nothing runs eagerly. The warm-up runs the
    first real step three times, which is harmless: every state write of a step overwrites its slot
    with the same value."""

    def __init__(self, model, step, capture: bool, sharded: bool = False):
        self.model, self.step, self.capture = model, step, capture
        self.sharded = sharded  # a sharded model's step: captured with its collectives (`_capture`)
        self.ids = torch.zeros(step.size, dtype=torch.long, device=model.embed.weight.device)
        self.streams = self.hidden = None
        self.graphs = []
        self.pool = None  # the memory pool to capture into (DecodeGraphs' shared one); None: a pool of its own

    def _run(self) -> None:
        from dsv4.model.block import run_blocks
        from dsv4.model.rope import shared_cos_sin
        m, step = self.model, self.step
        step.derive()
        h = m.embed(self.ids, validate=False)
        x = h.unsqueeze(1).expand(-1, m.config.hc_mult, -1).contiguous()
        with shared_cos_sin():  # the captured graph computes each RoPE table once
            x = run_blocks(m.layers, x, self.ids, step.pos, lambda i: None, step)
        self.streams, self.hidden = x, m.final_hidden(x)

    def run(self, input_ids: torch.Tensor, states: list, lens: list[int]) -> torch.Tensor:
        self.step.fill(states, lens)
        fill_padded(self.ids, input_ids)
        _launch(self)
        return self.hidden[:input_ids.shape[0]].clone()


class _MTPStepBucket:
    """The MTP block's draft rows over the engine's paged pools as one graph, like `_StepBucket`:
    embed + e/h projections, the block with its state reads and writes, HC head and norm."""

    def __init__(self, block, step, capture: bool, sharded: bool = False):
        dev = block.hc_head_base.device
        self.block, self.step, self.capture, self.sharded = block, step, capture, sharded
        width = block.hc_mult * block.config.hidden_size
        self.residual_in = torch.zeros(step.size, width, dtype=block.dtype, device=dev)
        self.ids = torch.zeros(step.size, dtype=torch.long, device=dev)
        self.residual = self.hidden = None
        self.graphs = []
        self.pool = None  # as `_StepBucket.pool`

    def _run(self) -> None:
        from dsv4.model.rope import shared_cos_sin
        self.step.derive()
        with shared_cos_sin():
            self.residual, self.hidden = self.block.compute(self.residual_in, self.ids, self.step.pos, None,
                                                            step=self.step)

    def run(self, prev_residual: torch.Tensor, ids: torch.Tensor, states: list, lens: list[int]):
        b = ids.shape[0]
        self.step.fill(states, lens, mtp=True)
        fill_padded(self.residual_in, prev_residual)
        fill_padded(self.ids, ids)
        _launch(self)
        return self.residual[:b].clone(), self.hidden[:b].clone()


def context_bucket(lengths) -> int:
    """Contexts rounded up to a power of two (at least 1024 tokens): one graph serves a range."""
    return max(1024, 1 << (max(lengths) - 1).bit_length())


class DecodeGraphs:
    """The buckets of a model (see the module docstring); built lazily."""

    def __init__(self, model, max_batch: int = 64, capture: bool = True):
        if capture and model.embed.weight.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device (capture=False runs the pieces eagerly)")
        if capture and model.kernels != "triton":
            raise ValueError("CUDA graphs need kernels='triton' (the torch MoE path reads expert ids back to the "
                             "host, which a captured graph cannot do)")
        self.model, self.capture = model, capture
        self.sharded = model.layout is not None  # paged whole steps and prefill pieces only (module docstring)
        # up to the first bucket that holds max_batch rows (max_batch 6 -> 8: a batch of 6 runs graphed)
        top = next((b for b in BUCKETS if b >= max_batch), BUCKETS[-1])
        self.sizes = [b for b in BUCKETS if b <= top]
        self.max_batch = self.sizes[-1]
        self._buckets: dict[int, PiecewiseBucket] = {}
        self._steps: dict[tuple, _StepBucket] = {}
        self._mtp_steps: dict[tuple, _MTPStepBucket] = {}
        self.head_steps: dict[tuple, object] = {}  # mixed steps' decode rows in one pass (dsv4.model.mixed_steps)
        self._prefill: dict[int, PiecewiseBucket] = {}  # short prefill forwards' pieces per token bucket
        self._mtp_prefill: dict[int, MTPPrefillBucket] = {}  # the MTP block's over those rows
        self.prefill_arena: StaticArena | None = None      # their static buffers (made with the first bucket)
        # below PREFILL_MAX_TOKENS where the engine asks (EngineConfig.prefill_graph_tokens), or lowered once a
        # bucket did not fit in GPU memory
        self.prefill_limit: int | None = None
        self._last = None  # the bucket of the last forward (`last_streams`)
        self.pool = torch.cuda.graph_pool_handle() if capture and SHARED_POOL else None  # paged steps' (SHARED_POOL)

    def handles(self, seq_lens) -> bool:
        """Whether a step over contiguous states runs piecewise (never for a sharded model)."""
        return not self.sharded and 0 < len(seq_lens) <= self.max_batch and all(int(n) == 1 for n in seq_lens)

    def handles_prefill(self, seq_lens) -> bool:
        """Whether a forward that no decode path takes runs as prefill pieces (dsv4.model.prefill_graphs): up to
        PREFILL_MAX_TOKENS tokens, not one token from each of several sequences (the attention's batched decode
        path, which leaves the inverse RoPE to `finish`). Sharded ranks run the same batches, so they agree."""
        lens = [int(n) for n in seq_lens if int(n)]  # (sequences without tokens get no segment)
        size = prefill_bucket_size(sum(lens), self.prefill_limit)
        return size is not None and not (len(lens) > 1 and all(n == 1 for n in lens))

    def prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, segments_per_layer,
                head_step=None) -> torch.Tensor | None:
        """Hidden states [T, D] of a short forward as prefill pieces (the streams land in `last_streams(T)`), or
        None when its bucket did not fit in GPU memory (nothing done: the caller runs the forward eagerly).
        `head_step`: a mixed step's decode rows (Attention.attend)."""
        bucket = self._captured_prefill(prefill_bucket_size(input_ids.shape[0], self.prefill_limit))
        if bucket is None:
            return None
        self._last = bucket
        return bucket.forward(input_ids, positions, segments_per_layer, head_step)

    def mtp_prefill(self, prev_residual: torch.Tensor, next_token_ids: torch.Tensor, positions: torch.Tensor,
                    segments) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The MTP block's (residual, hidden) over a short prefill's rows as pieces (`handles_prefill` said so), or
        None when its bucket did not fit in GPU memory (nothing done: the caller runs the block eagerly)."""
        bucket = self._captured_prefill(prefill_bucket_size(next_token_ids.shape[0], self.prefill_limit), mtp=True)
        return None if bucket is None else bucket.run(prev_residual, next_token_ids, positions, segments)

    def _prefill_bucket(self, size: int, mtp: bool = False) -> PiecewiseBucket:
        buckets = self._mtp_prefill if mtp else self._prefill
        bucket = buckets.get(size)
        if bucket is None:
            if self.prefill_arena is None:
                self.prefill_arena = StaticArena(max(prefill_bucket_sizes(self.prefill_limit), default=size))
            make = MTPPrefillBucket if mtp else PiecewiseBucket
            bucket = buckets[size] = make(self.model, size, self.capture, pool=self.pool, sharded=self.sharded,
                                          arena=self.prefill_arena)
        return bucket

    def _captured_prefill(self, size: int, mtp: bool = False) -> PiecewiseBucket | None:
        """The bucket of `size` tokens, captured (with `capture`); None if that ran out of GPU memory: then every
        bucket and the static buffers go, and the limit drops to the bucket below the larger of `size` and the
        static buffers' rows (the first bucket made sizes them for the largest, so a small bucket's failure may be
        theirs; module docstring of prefill_graphs). Sharded ranks re-raise: they must all run the same buckets."""
        try:
            bucket = self._prefill_bucket(size, mtp)
            bucket.ensure_captured()
            return bucket
        except torch.OutOfMemoryError as e:
            if self.sharded:
                raise
            error = str(e).split("\n")[0]
        # (outside the handler: the exception's frames no longer hold the buckets' memory)
        top = max(size, self.prefill_arena.capacity if self.prefill_arena is not None else 0)
        if any(self._last is b for b in self._prefill.values()):
            self._last = None
        self._prefill.clear()
        self._mtp_prefill.clear()
        self.prefill_arena = None
        self.prefill_limit = max((s for s in prefill_bucket_sizes(self.prefill_limit) if s < top), default=0)
        torch.cuda.empty_cache()
        log.warning("prefill graphs: the %d-token bucket did not fit in GPU memory (%s); forwards of more than %d "
                    "tokens run eagerly", size, error, self.prefill_limit)
        return None

    def capture_prefill(self, mtp: bool = False) -> list[int]:
        """Make every prefill bucket now (and capture its pieces, with `capture`) rather than at its first forward,
        with `mtp` the MTP block's too: a server's first short prompts then wait for no capture. The largest first,
        so that an out-of-memory error names the bucket that did not fit. The sizes captured by this call (once one
        did not fit, those below the lowered limit, made again)."""
        captured: set[int] = set()
        kinds = (False, True) if mtp else (False,)
        while True:
            for size, kind in [(s, k) for s in reversed(prefill_bucket_sizes(self.prefill_limit)) for k in kinds]:
                buckets = self._mtp_prefill if kind else self._prefill
                had = bool(size in buckets and buckets[size].graphs)
                bucket = self._captured_prefill(size, kind)
                if bucket is None:
                    break  # (the limit is lower now: again from the largest bucket left)
                if bucket.graphs and not had:
                    captured.add(size)
            else:
                return sorted(captured & set(self._prefill))

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor, segments_per_layer) -> torch.Tensor:
        """Hidden states [B, D] of one decode step; the residual streams land in `last_streams(B)`."""
        size = next(s for s in self.sizes if s >= input_ids.shape[0])
        bucket = self._buckets.get(size)
        if bucket is None:
            bucket = self._buckets[size] = PiecewiseBucket(self.model, size, self.capture, prefill=False)
        self._last = bucket
        return bucket.forward(input_ids, positions, segments_per_layer)

    def paged_step(self, pools, input_ids: torch.Tensor, states: list, lens: list[int]) -> torch.Tensor:
        """Hidden states [T, D] of a fixed-shape step over paged states (sequence b brings lens[b]
        tokens), as one graph per (row bucket, context bucket): contexts rounded up to a power of two
        (at least 1024 tokens)."""
        size = next(s for s in self.sizes if s >= input_ids.shape[0])
        ctx = context_bucket([s.num_tokens + n for s, n in zip(states, lens)])
        bucket = self._steps.get((pools, size, ctx))
        if bucket is None:
            bucket = self._steps[pools, size, ctx] = _StepBucket(self.model, pools.decode_step(size, ctx),
                                                                 self.capture, self.sharded)
            bucket.pool = self.pool
        self._last = bucket
        return bucket.run(input_ids, states, lens)

    def paged_mtp_step(self, pools, block, prev_residual: torch.Tensor, ids: torch.Tensor, states: list,
                       lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP block's (residual [T, hc*D], hidden [T, D]) for draft rows over the paged states
        (`MTPBlock.forward` with graphs), one graph per (row bucket, context bucket)."""
        size = next(s for s in self.sizes if s >= ids.shape[0])
        ctx = context_bucket([s.mtp.num_tokens + n for s, n in zip(states, lens)])
        bucket = self._mtp_steps.get((pools, size, ctx))
        if bucket is None:
            bucket = self._mtp_steps[pools, size, ctx] = _MTPStepBucket(block, pools.decode_step(size, ctx),
                                                                         self.capture, self.sharded)
            bucket.pool = self.pool
        return bucket.run(prev_residual, ids, states, lens)

    def last_streams(self, b: int) -> torch.Tensor:
        return self._last.streams[:b].clone()
