"""Per-sequence decode state (spec deepseek_v4_model.md §3.1), with rollback of the last few tokens.

One `LayerState` per layer (and one for the MTP block) holds everything a sequence needs to continue
exactly where it stopped, whatever the chunking:

* window ring: the KV vectors of the last `window + max_rollback` positions (slot `p mod capacity`);
* compressed entries ("main", CSA/HCA) and indexer keys ("index", CSA): append-only, entry i at row i;
* compressor rows per compressor: the raw fp32 `(C_t, Z_t + ape[t mod r])` rows of the most recent
  positions -- the open window, for CSA also the previous complete window (its A halves feed the next
  entry), and enough older rows that a rollback of `max_rollback` tokens can reopen a closed window.

All reads and writes go through the small method set below (`window`, `compressor_ring`, `entries`,
`append_entries`, `append_tokens`, `truncate`), so a paged implementation can replace this contiguous
one. Rollback: `truncate(n)` forgets the last n tokens; it is allowed as long as the result is not
older than `num_tokens - max_rollback` measured at the furthest point reached (`min_length`).
A forward that raises after validation (it should not) leaves the states of its batch undefined.
"""
from __future__ import annotations

import torch

from dsv4.config import LayerSpec, ModelConfig
from dsv4.model.numerics import acc_dtype


def oldest_needed_row(ratio: int, overlap: bool, min_length: int) -> int:
    """First position whose raw compressor row a rollback to `min_length` may still need: the window
    open at min_length and, for the overlapping (CSA) compressor, the complete window before it."""
    if not ratio:
        return 0
    return max(0, ratio * (min_length // ratio - (1 if overlap else 0)))


def truncate_target(state, num_tokens: int) -> int:
    """Length of `state` after forgetting `num_tokens` tokens; ValueError if the rollback is too deep."""
    target = state.num_tokens - num_tokens
    if num_tokens < 0 or target < state.min_length:
        raise ValueError(f"cannot truncate {num_tokens} tokens from a state of {state.num_tokens} "
                         f"(can go back to {state.min_length}, max_rollback={state.max_rollback})")
    return target


class GrowBuffer:
    """Rows appended at the end, dropped from the end; capacity doubles so appends are amortised O(1)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device):
        self._data = torch.empty(16, width, dtype=dtype, device=device)
        self.size = 0

    def append(self, rows: torch.Tensor) -> None:
        need = self.size + rows.shape[0]
        if need > self._data.shape[0]:
            grown = torch.empty(max(need, 2 * self._data.shape[0]), self._data.shape[1],
                                dtype=self._data.dtype, device=self._data.device)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size: need] = rows
        self.size = need

    def view(self) -> torch.Tensor:
        return self._data[: self.size]

    def truncate(self, size: int) -> None:
        self.size = min(self.size, size)


class CompressorRows:
    """Raw compressor rows for positions [first, end) (fp32, c*d wide)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device):
        self.first = 0
        self.c = torch.empty(0, width, dtype=dtype, device=device)
        self.z = torch.empty(0, width, dtype=dtype, device=device)

    @property
    def end(self) -> int:
        return self.first + self.c.shape[0]

    def append(self, c: torch.Tensor, z: torch.Tensor, keep_from: int) -> None:
        c, z = torch.cat((self.c, c)), torch.cat((self.z, z))
        drop = max(0, min(keep_from, self.first + c.shape[0]) - self.first)
        self.c, self.z = c[drop:].clone(), z[drop:].clone()
        self.first += drop

    def truncate(self, end: int) -> None:
        keep = max(0, end - self.first)
        self.c, self.z = self.c[:keep], self.z[:keep]


class LayerState:
    def __init__(self, config: ModelConfig, spec: LayerSpec, dtype: torch.dtype,
                 device: torch.device | str = "cpu", max_rollback: int = 4):
        device = torch.device(device)
        self.spec = spec
        self.window_size = config.window
        self.max_rollback = max_rollback
        self.ratio = spec.compress_ratio
        self.overlap = spec.compress_ratio == 4
        self.dtype = dtype
        self.num_tokens = 0
        self.min_length = 0  # truncate() may not go below this
        self._ring = torch.zeros(config.window + max_rollback, config.head_dim, dtype=dtype, device=device)
        widths = {}
        if spec.has_compressor:
            widths["main"] = config.head_dim
        if spec.has_indexer:
            widths["index"] = config.index_head_dim
        c = 2 if self.overlap else 1
        acc = acc_dtype(dtype)
        self._entries = {k: GrowBuffer(d, dtype, device) for k, d in widths.items()}
        self._rows = {k: CompressorRows(c * d, acc, device) for k, d in widths.items()}

    # ---- reads ---------------------------------------------------------------------------
    def window(self, fused: bool = False, tail: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """KV vectors and positions of the last `window - 1` positions (what the next token's window
        needs besides itself), oldest first (`fused`: the paged state's kernel-mode read; none here). tail: rows
        appended after the window's KV (a chunk's own keys; returned as they are when the window is empty); the
        positions stay the window's."""
        end = self.num_tokens
        positions = torch.arange(max(0, end - self.window_size + 1), end, device=self._ring.device)
        kv = self._ring[positions % self._ring.shape[0]]
        if tail is None:
            return kv, positions
        return (torch.cat((kv, tail)) if positions.numel() else tail), positions

    def compressor_ring(self, name: str) -> tuple[tuple, int]:
        """((C rows, Z rows, 0, count), position of the first row): the raw rows, which run up to `num_tokens`, as
        a ring that starts at row 0 (`cache_store.ring_rows`; the paged state's is a real ring)."""
        rows = self._rows[name]
        return (rows.c, rows.z, 0, rows.c.shape[0]), rows.first

    def entries(self, name: str, fused: bool = False) -> torch.Tensor:
        """All compressed entries ("main") or indexer keys ("index") produced so far."""
        return self._entries[name].view()

    def num_entries(self, name: str) -> int:
        return self._entries[name].size

    # ---- writes --------------------------------------------------------------------------
    def stores_fused(self, name: str) -> bool:
        """Whether the entries could be stored by a fused kernel (`PagedLayerState.append_stored`): not here,
        where they are kept as computed."""
        return False

    def append_entries(self, name: str, entries: torch.Tensor) -> None:
        """Entries completed by the chunk being processed (visible to that chunk's queries)."""
        self._entries[name].append(entries)

    def append_tokens(self, kv: torch.Tensor, rows: dict[str, tuple[torch.Tensor, torch.Tensor]],
                      fused: bool = False) -> None:
        """Commit a chunk of n tokens: their window kv and raw compressor rows (`fused`: the paged state's
        kernel-mode store; nothing here is quantised)."""
        n = kv.shape[0]
        start, end = self.num_tokens, self.num_tokens + n
        if set(rows) != set(self._rows):
            raise ValueError(f"layer {self.spec.index}: expected compressor rows {sorted(self._rows)}, "
                             f"got {sorted(rows)}")
        cap = self._ring.shape[0]
        keep = min(n, cap)
        slots = torch.arange(end - keep, end, device=self._ring.device) % cap
        self._ring[slots] = kv[n - keep:].to(self._ring.dtype)
        self.min_length = max(self.min_length, end - self.max_rollback)
        keep_from = oldest_needed_row(self.ratio, self.overlap, self.min_length)
        for name, (c, z) in rows.items():
            if self._rows[name].end != start:
                raise RuntimeError(f"layer {self.spec.index}: compressor rows out of sync")
            self._rows[name].append(c, z, keep_from)
            if self._entries[name].size != end // self.ratio:
                raise RuntimeError(f"layer {self.spec.index}: {self._entries[name].size} {name} entries "
                                   f"after {end} tokens (expected {end // self.ratio})")
        self.num_tokens = end

    def truncate(self, num_tokens: int) -> None:
        """Forget the last `num_tokens` tokens."""
        target = truncate_target(self, num_tokens)
        for name in self._rows:
            self._rows[name].truncate(target)
            self._entries[name].truncate(target // self.ratio)
        self.num_tokens = target


class SequenceState:
    """Decode state of one sequence: a LayerState per backbone layer, plus one for the MTP block.

    The MTP block's state advances separately (it runs one position behind the backbone when used for
    speculative drafts); `truncate` rolls back the backbone layers, `mtp.truncate` the MTP block.
    """

    def __init__(self, layers: list[LayerState], mtp: LayerState | None = None):
        self.layers = layers
        self.mtp = mtp
        self.dtype = layers[0].dtype

    @classmethod
    def create(cls, config: ModelConfig, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", max_rollback: int = 4) -> "SequenceState":
        if max_rollback < 0:
            raise ValueError(f"max_rollback={max_rollback}: must be >= 0")
        layers = [LayerState(config, spec, dtype, device, max_rollback) for spec in config.layers]
        mtp = LayerState(config, config.mtp_layer, dtype, device, max_rollback) \
            if config.num_nextn_predict_layers else None
        return cls(layers, mtp)

    @property
    def num_tokens(self) -> int:
        return self.layers[0].num_tokens

    def truncate(self, num_tokens: int) -> None:
        """Roll the backbone back by `num_tokens` tokens (all layers or none)."""
        for layer in self.layers:  # validate first so a refused rollback changes nothing
            if num_tokens < 0 or layer.num_tokens - num_tokens < layer.min_length:
                layer.truncate(num_tokens)  # raises the explanatory ValueError
        for layer in self.layers:
            layer.truncate(num_tokens)
