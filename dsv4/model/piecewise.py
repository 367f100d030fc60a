"""Piecewise CUDA graphs over a stack of blocks: each block's stateless parts (`post(i-1) + pre(i)`) captured per row
bucket, its attention run eagerly in between over the real rows (the sizes of the sequences' states change every
step). Used by the short prefill forwards (dsv4.model.prefill_graphs) and the decode steps over contiguous states
(dsv4.model.graphs, which owns the buckets); `capture_graphs` and `fill_padded` serve the whole-step graphs too."""
from __future__ import annotations

import torch

from dsv4.model.block import finish_carry, fuses_block_sites
from dsv4.model.rope import shared_cos_sin


class PiecewiseBucket:
    """Static buffers and pieces of one bucket: the layers' stateless parts (`post(i-1) + pre(i)`) captured, their
    attention run eagerly in between over the real rows. `prefill` (dsv4.model.prefill_graphs): the pieces copy what
    crosses to the next step into static buffers (memory that does not grow with depth) and the attention may apply
    the inverse RoPE itself, as the eager prefill does; else (decode steps over contiguous states, one token per
    sequence) the pieces' own tensors are kept, one set per layer, and `finish` rotates, as the batched decode
    attention needs."""

    def __init__(self, model, size: int, capture: bool, pool=None, sharded: bool = False, prefill: bool = True,
                 arena: StaticArena | None = None):
        dev = model.embed.weight.device
        self.model, self.size, self.capture, self.pool, self.sharded = model, size, capture, pool, sharded
        self.prefill, self.arena = prefill, arena
        self.ids = torch.zeros(size, dtype=torch.long, device=dev)
        self.pos = torch.zeros(size, dtype=torch.long, device=dev)
        self.layers = self._stack()
        n = len(self.layers)
        self._static: dict[tuple, torch.Tensor] = {}
        self.x: list = [None] * (n + 1)   # streams entering layer i (prefill: static, parity i % 2); x[n]: after all
        self.hc: list = [None] * n        # mHC (post, comb) of layer i's attention site
        self.pre: list = [None] * n       # AttentionInputs of layer i
        self.rotated: list = [False] * n  # whether layer i's attention applies the inverse RoPE itself
        self.attended = None              # the attention output of the layer in flight (one buffer for all)
        self.hidden = None
        self.graphs: list = []
        # the eager forward's fusion (block.run_blocks): layer i-1's MoE post inside layer i's attention pre, the
        # last one's after the loop -- the same kernels, so the graphs keep the eager bits
        self.fuse = self._fuses()
        self.pieces = [self._piece(i) for i in range(n + 1)]

    # the stack and its ends (MTPPrefillBucket: the MTP block's)
    def _stack(self) -> list:
        return list(self.model.layers)

    def _first(self) -> torch.Tensor:
        """The streams entering the first block."""
        h = self.model.embed(self.ids, validate=False)  # the model's forward checked the real ids
        return h.unsqueeze(1).expand(-1, self.model.config.hc_mult, -1).contiguous()

    def _final(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states from the streams after the last block."""
        return self.model.final_hidden(x)

    def _token_ids(self) -> torch.Tensor | None:
        """The token ids the blocks' MoE routes by (hash layers)."""
        return self.ids

    def _fuses(self) -> bool:
        """Whether each block's MoE post is deferred to the next block's attention pre (as `run_blocks` does)."""
        return fuses_block_sites(self.layers)

    @property
    def streams(self) -> torch.Tensor:
        return self.x[-1]

    def _keep(self, slot: int, name: str, t):
        """prefill: t copied into the static buffer of (slot, name, shape, dtype); tuples element-wise; None stays.
        Else t itself."""
        if t is None or not self.prefill:
            return t
        if isinstance(t, tuple):
            return tuple(self._keep(slot, f"{name}.{j}", v) for j, v in enumerate(t))
        if self.arena is not None and t.shape[0] == self.size <= self.arena.capacity:
            buf = self.arena.rows(slot, name, t)
        else:
            key = (slot, name, tuple(t.shape), t.dtype)
            buf = self._static.get(key)
            if buf is None:  # (first run: the warm-up, outside any capture)
                buf = self._static[key] = torch.empty_like(t, memory_format=torch.contiguous_format)
        buf.copy_(t)
        return buf

    def _piece(self, i: int):
        layers, n, fuse = self.layers, len(self.layers), self.fuse

        def run() -> None:
            carry = None
            with shared_cos_sin():
                if i == 0:
                    x = self._first()
                else:
                    out = layers[i - 1].post(self.x[i - 1], self.attended, self.pre[i - 1], self.hc[i - 1],
                                             self._token_ids(), rotated=self.rotated[i - 1], defer=fuse)
                    x, carry = out if fuse else (out, None)
                if i == n:
                    self.x[n] = self._keep(n % 2, "x", finish_carry(x, carry))
                    self.hidden = self._keep(0, "hidden", self._final(self.x[n]))
                    return
                if carry is not None:
                    x, hc, pre = layers[i]._pre_after(x, carry, self.pos)
                else:
                    hc, pre = layers[i].pre(x, self.pos)
            # read by the next piece (post / finish) while it writes layer i + 1's: one buffer per parity
            self.x[i], self.hc[i] = self._keep(i % 2, "x", x), self._keep(i % 2, "hc", hc)
            tensors = {f: self._keep(i % 2, f"pre.{f}", getattr(pre, f)) for f in ("cos", "sin")}
            # read by layer i's attention only, before the next piece writes layer i + 1's: one buffer
            tensors.update({f: self._keep(0, f"pre.{f}", getattr(pre, f)) for f in
                            ("q", "kv", "rows", "index_rows", "index_q", "index_w")})
            self.pre[i] = pre._replace(**tensors)
            self.rotated[i] = self.prefill and layers[i].attn.rotates(pre, None)
            if self.attended is None:  # zeros: read by the warm-up's pieces before any attention ran
                self.attended = self._keep(0, "attended", torch.zeros_like(self.pre[i].q))
        return run

    def ensure_captured(self) -> bool:
        """Capture the pieces if they are not yet (whatever the static inputs hold: the pieces touch no state);
        whether this call captured them."""
        if not self.capture or self.graphs:
            return False
        self.graphs = capture_graphs(self.pieces, sharded=self.sharded, pool=self.pool)
        return True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, segments_per_layer,
                head_step=None) -> torch.Tensor:
        """Hidden states [T, D] of the forward (T = the real rows); the streams land in `streams` (`head_step`: a
        mixed step's decode rows, see Attention.attend)."""
        t = input_ids.shape[0]
        fill_padded(self.ids, input_ids)
        fill_padded(self.pos, positions)
        self.ensure_captured()
        layers = self.layers
        with shared_cos_sin():  # the eager attentions' RoPE tables (compressed entries) once for all layers
            for i in range(len(self.pieces)):
                if self.capture:
                    self.graphs[i].replay()
                else:
                    self.pieces[i]()
                if i < len(layers):
                    layers[i].attn.attend(self.pre[i], self.pos, segments_per_layer(i), out=self.attended,
                                          rotate=self.rotated[i], head_step=head_step)
        return self.hidden[:t].clone()  # the static buffer is overwritten by the next forward


class MTPPrefillBucket(PiecewiseBucket):
    """The MTP block over a short prefill's rows (the speculator's catch-up after a prompt chunk) as pieces: its
    input mix + `pre` captured, its attention eager, its `post` + HC head + norm captured. Its eager forward
    (`MTPBlock.compute`) defers no MoE post and routes by no token ids, so neither do these pieces: the same kernels
    on the same rows. The main model's residual comes in through a static buffer too (shared with the other buckets
    like theirs)."""

    def __init__(self, model, size: int, capture: bool, pool=None, sharded: bool = False,
                 arena: StaticArena | None = None):
        self.block = model.mtp[0]
        row, dev = (model.config.hc_mult * model.config.hidden_size,), model.embed.weight.device
        self.prev = (arena.buffer(0, "mtp.prev", size, row, model.dtype, dev) if arena is not None and
                     size <= arena.capacity else torch.zeros((size, *row), dtype=model.dtype, device=dev))
        super().__init__(model, size, capture, pool, sharded, prefill=True, arena=arena)

    def _stack(self) -> list:
        return [self.block]

    def _first(self) -> torch.Tensor:
        return self.block.mix_inputs(self.prev, self.ids)

    def _final(self, x: torch.Tensor) -> torch.Tensor:
        return self.block.head(x)

    def _token_ids(self) -> None:
        return None

    def _fuses(self) -> bool:
        return False

    def run(self, prev_residual: torch.Tensor, next_token_ids: torch.Tensor, positions: torch.Tensor,
            segments) -> tuple[torch.Tensor, torch.Tensor]:
        """`MTPBlock.compute` over these rows: (residual [T, hc*D], hidden [T, D])."""
        t = next_token_ids.shape[0]
        fill_padded(self.prev, prev_residual)  # (copy_ rounds to the model dtype, as compute's `.to`)
        hidden = self.forward(next_token_ids, positions, lambda i: segments)
        return self.streams[:t].flatten(1).clone(), hidden


class StaticArena:
    """The prefill buckets' static buffers, shared by every bucket: one buffer of `capacity` rows per (slot, name,
    row shape, dtype), of which a bucket of T tokens uses the first T rows. Safe because one forward runs at a time
    (one stream) and its results are cloned before the next (`forward`, `last_streams`), so the memory is the
    largest bucket's (≈ 0.24 MB per token for Flash) rather than the sum over the buckets."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._bufs: dict[tuple, torch.Tensor] = {}

    def rows(self, slot: int, name: str, t: torch.Tensor) -> torch.Tensor:
        """The buffer for a bucket's copy of t (its first t.shape[0] rows)."""
        return self.buffer(slot, name, t.shape[0], tuple(t.shape[1:]), t.dtype, t.device)

    def buffer(self, slot: int, name: str, rows: int, row_shape: tuple, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
        key = (slot, name, row_shape, dtype)
        buf = self._bufs.get(key)
        if buf is None:  # (made by the first bucket's warm-up, outside any capture)
            buf = self._bufs[key] = torch.zeros((self.capacity, *row_shape), dtype=dtype, device=device)
        return buf[:rows]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())


def capture_graphs(pieces, sharded: bool = False, pool=None) -> list:
    """Warm up (kernels compiled, lazy weight copies made), then one graph per piece, one pool (`pool`, else a
    new one). sharded: capture errors only for this thread's calls (the process group's NCCL watchdog thread
    queries CUDA events meanwhile, which a process-wide capture would refuse)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for run in pieces:
                run()
    torch.cuda.current_stream().wait_stream(side)
    pool, graphs = pool or torch.cuda.graph_pool_handle(), []
    for run in pieces:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local" if sharded else "global"):
            run()
        graphs.append(g)
    return graphs


def fill_padded(buf: torch.Tensor, rows: torch.Tensor) -> None:
    """Static input buffer <- this step's rows; the padding rows are zeroed (no sequence reads them).
    Queued on the stream, never waited for (host rows go through pinned memory)."""
    from dsv4.model.context import to_device
    b = rows.shape[0]
    buf[:b].copy_(to_device(rows, buf.device), non_blocking=True)
    if b < buf.shape[0]:
        buf[b:].zero_()
