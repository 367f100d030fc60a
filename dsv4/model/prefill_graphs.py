"""Short prefill forwards under piecewise CUDA graphs: the layers' stateless parts captured, their attention eager.

Why: an eager forward of a few hundred tokens is bound by the host, not the GPU. Session 60 (H100, 8 Flash layers,
one fresh prompt): 128 tokens took 62-72 ms of wall time for 17 ms of GPU work, the GPU idle before 613 of its 698
kernels; the host spends ≈ 8 ms per layer in Python and launches. Decode steps are whole graphs
(dsv4.model.graphs), but a prefill chunk's attention writes each sequence's state with sizes that change every
step. So a forward of T tokens (any mix of sequences' chunks, up to PREFILL_MAX_TOKENS) is cut as the piecewise
decode graphs cut it:

    piece 0      embed -> layer 0 `pre`                       (captured)
    attend 0     layer 0 attention over the sequences' chunks (eager: `Attention.attend` with the segments)
    piece i      layer i-1 `post` -> layer i `pre`            (captured)
    ...
    piece L      layer L-1 `post` -> HC head + final norm     (captured)

one set of graphs per token bucket (PREFILL_BUCKETS: T padded with token 0 at position 0; `pre` and `post` are
per token, and `attend` reads and writes only the real rows, so padding rows touch no state and no real row).

Memory: each piece copies what crosses to the next step into static buffers shared by the layers: what the next
piece reads while it writes its own (the residual streams, the mHC post / comb, the RoPE tables `finish` needs) one
per layer parity, what only the eager attention in between reads (q, kv, the compressor and indexer rows) one for
all, plus one attention output buffer: ≈ 0.24 MB per token for Flash (≈ 117 MB for all five buckets), whatever the
depth. What a piece allocates inside its graph is transient, so every piece may capture into the decode graphs'
shared pool (each replay's results are copied out before the next graph replays). Results equal the eager forward
at the bucket's size bit for bit (the same kernels on the same rows); a padded forward may pick other GEMM shapes
(cuBLAS from 256 rows) than the unpadded eager one.

A sharded model (TP/EP ranks in lock-step: every rank the same batch, so the same bucket) runs the pieces too, their
collectives inside the captured pieces as in the paged step graphs (`_capture(sharded=True)`). Ranks capture only when
`--cuda-graphs` is given, and that capture has not run on two GPUs yet; the plumbing is CPU-tested on gloo ranks
(tests/test_distributed.py, `capture=False`).
"""
from __future__ import annotations

import torch

from dsv4.model.block import finish_carry, fuses_block_sites

PREFILL_BUCKETS = (16, 32, 64, 128, 256)
# Forwards of up to this many tokens run as prefill pieces (0: never). Session 60 (H100, 8 Flash layers, one fresh
# prompt; bench/bench_prefill_graphs.py): eager / pieces 43.3 / 12.8 ms at 16 tokens, 48.0 / 13.8 at 64, 56.6 / 18.3
# at 128, 54.4 / 22.7 at 256. Larger forwards are nearer the GPU's bound (2048 tokens: ≈ 45 ms wall for 31 ms of
# GPU); a 512 bucket was not measured.
PREFILL_MAX_TOKENS = 256


def prefill_bucket_size(tokens: int) -> int | None:
    """The bucket a forward of `tokens` tokens runs in, or None (eager)."""
    if not 0 < tokens <= PREFILL_MAX_TOKENS:
        return None
    return next((b for b in PREFILL_BUCKETS if b >= tokens), None)


def prefill_bucket_sizes() -> list[int]:
    """Every bucket a forward may run in (the one that holds PREFILL_MAX_TOKENS included)."""
    return sorted({prefill_bucket_size(min(b, PREFILL_MAX_TOKENS)) for b in PREFILL_BUCKETS} - {None})


class PrefillBucket:
    """Static buffers and pieces of one token bucket (see the module docstring)."""

    def __init__(self, model, size: int, capture: bool, pool=None, sharded: bool = False):
        dev = model.embed.weight.device
        self.model, self.size, self.capture, self.pool, self.sharded = model, size, capture, pool, sharded
        self.ids = torch.zeros(size, dtype=torch.long, device=dev)
        self.pos = torch.zeros(size, dtype=torch.long, device=dev)
        n = len(model.layers)
        self._static: dict[tuple, torch.Tensor] = {}
        self.x: list = [None] * (n + 1)   # streams entering layer i (static: parity i % 2); x[n] after the last
        self.hc: list = [None] * n        # mHC (post, comb) of layer i's attention site
        self.pre: list = [None] * n       # AttentionInputs of layer i
        self.rotated: list = [False] * n  # whether layer i's attention applies the inverse RoPE itself
        self.attended = None              # the attention output of the layer in flight (one buffer for all)
        self.hidden = None
        self.graphs: list = []
        self.fuse = fuses_block_sites(model.layers)  # the eager forward's cross-block fusion (block.run_blocks)
        self.pieces = [self._piece(i) for i in range(n + 1)]

    @property
    def streams(self) -> torch.Tensor:
        return self.x[-1]

    def _keep(self, slot: int, name: str, t):
        """t copied into the static buffer of (slot, name, shape, dtype); tuples element-wise; None stays."""
        if t is None:
            return None
        if isinstance(t, tuple):
            return tuple(self._keep(slot, f"{name}.{j}", v) for j, v in enumerate(t))
        key = (slot, name, tuple(t.shape), t.dtype)
        buf = self._static.get(key)
        if buf is None:  # (first run: the warm-up, outside any capture)
            buf = self._static[key] = torch.empty_like(t, memory_format=torch.contiguous_format)
        buf.copy_(t)
        return buf

    def _piece(self, i: int):
        m, n, fuse = self.model, len(self.model.layers), self.fuse

        def run() -> None:
            from dsv4.model.rope import shared_cos_sin
            carry = None
            with shared_cos_sin():
                if i == 0:
                    h = m.embed(self.ids, validate=False)  # the model's forward checked the real ids
                    x = h.unsqueeze(1).expand(-1, m.config.hc_mult, -1).contiguous()
                else:
                    out = m.layers[i - 1].post(self.x[i - 1], self.attended, self.pre[i - 1], self.hc[i - 1],
                                               self.ids, rotated=self.rotated[i - 1], defer=fuse)
                    x, carry = out if fuse else (out, None)
                if i == n:
                    self.x[n] = self._keep(n % 2, "x", finish_carry(x, carry))
                    self.hidden = self._keep(0, "hidden", m.final_hidden(self.x[n]))
                    return
                if carry is not None:
                    x, hc, pre = m.layers[i]._pre_after(x, carry, self.pos)
                else:
                    hc, pre = m.layers[i].pre(x, self.pos)
            # read by the next piece (post / finish) while it writes layer i + 1's: one buffer per parity
            self.x[i], self.hc[i] = self._keep(i % 2, "x", x), self._keep(i % 2, "hc", hc)
            tensors = {f: self._keep(i % 2, f"pre.{f}", getattr(pre, f)) for f in ("cos", "sin")}
            # read by layer i's attention only, before the next piece writes layer i + 1's: one buffer
            tensors.update({f: self._keep(0, f"pre.{f}", getattr(pre, f)) for f in
                            ("q", "kv", "rows", "index_rows", "index_q", "index_w")})
            self.pre[i] = pre._replace(**tensors)
            self.rotated[i] = m.layers[i].attn.rotates(pre, None)
            if self.attended is None:  # zeros: read by the warm-up's pieces before any attention ran
                self.attended = torch.zeros_like(self.pre[i].q)
        return run

    def ensure_captured(self) -> bool:
        """Capture the pieces if they are not yet (whatever the static inputs hold: the pieces touch no state);
        whether this call captured them."""
        if not self.capture or self.graphs:
            return False
        from dsv4.model.graphs import _capture
        self.graphs = _capture(self.pieces, sharded=self.sharded, pool=self.pool)
        return True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, segments_per_layer) -> torch.Tensor:
        """Hidden states [T, D] of the forward (T = the real rows); the streams land in `streams`."""
        from dsv4.model.graphs import _fill_padded
        t = input_ids.shape[0]
        _fill_padded(self.ids, input_ids)
        _fill_padded(self.pos, positions)
        self.ensure_captured()
        layers = self.model.layers
        for i in range(len(self.pieces)):
            if self.capture:
                self.graphs[i].replay()
            else:
                self.pieces[i]()
            if i < len(layers):
                layers[i].attn.attend(self.pre[i], self.pos, segments_per_layer(i), out=self.attended,
                                      rotate=self.rotated[i])
        return self.hidden[:t].clone()  # the static buffer is overwritten by the next forward
