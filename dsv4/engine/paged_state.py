"""Paged storage of the model's decode state: preallocated pools indexed by the block tables.

`PagedLayerState` implements the same small interface as `dsv4.model.state.LayerState` (window,
compressor_ring, entries, num_entries, append_entries, append_tokens, truncate), so the model
cannot tell the two apart; the tests check that logits are identical. Page ids come from the
`BlockManager` (one block table per kind, shared by every layer), so a pool tensor per layer and
kind is `[num_pages, page_size, width]`:

  window         ring of window + max_rollback slots per sequence (slot = position mod ring)
  compressed{r}  compressed KV entries of ratio-r layers, entry i at index i
  indexer4       indexer keys of ratio-4 layers
  state          one page per sequence: the compressors' raw rows, a ring of `rows_cap` slots

KV as FP8 (`kv_dtype="fp8"`): the 448 nope dims as e4m3 + one E8M0 byte per 64 dims (+1 pad
byte), the rope dims in the model dtype — the 584-byte `fp8_ds_mla` entry when that is bf16 — and
indexer keys as MXFP4 (64 bytes of e2m1 + 4 E8M0 bytes = 68 B). With `numerics="reference"` the
nope dims are already FP8-simulated with power-of-two block-64 scales and the indexer keys
FP4-simulated with power-of-two block-32 scales, so this storage is lossless (a test checks it).
"""
from __future__ import annotations

import torch

from ..config import LayerSpec, ModelConfig
from ..kernels._triton import interpreted
from ..quant.e8m0 import e8m0_to_float
from ..quant.fp8 import quantize_act
from ..quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from ..model import rope
from ..model.state import oldest_needed_row, truncate_target
from .block_manager import BlockManager
from .paged_decode import DecodeStep

KV_BLOCK = 64


class _EntryPool:
    """[pages, page_size, width] storage: plain, FP8 for the first `nope` dims, or MXFP4 (fp4).
    Zero-filled, so that every slot ever read (masked padding included) holds finite values."""

    def __init__(self, pages: int, page_size: int, width: int, nope: int, fp8: bool, dtype, device,
                 fp4: bool = False):
        self.page_size, self.width, self.nope, self.fp8, self.fp4 = page_size, width, nope, fp8, fp4
        if fp4:
            self.q = torch.zeros(pages, page_size, width // 2, dtype=torch.int8, device=device)
            self.s = torch.zeros(pages, page_size, width // 32, dtype=torch.uint8, device=device)
        elif fp8:
            self.q = torch.zeros(pages, page_size, nope, dtype=torch.float8_e4m3fn, device=device)
            self.s = torch.zeros(pages, page_size, nope // KV_BLOCK, dtype=torch.uint8, device=device)
            self.rope = torch.zeros(pages, page_size, width - nope, dtype=dtype, device=device)
        else:
            self.data = torch.zeros(pages, page_size, width, dtype=dtype, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """The storage tensors, each [pages, page_size, ...]."""
        return [self.q, self.s] if self.fp4 else [self.q, self.s, self.rope] if self.fp8 else [self.data]

    def nbytes_per_slot(self) -> int:
        return entry_bytes(self.width, self.nope, self.fp8, self.fp4,
                           (self.rope if self.fp8 else self.data).element_size() if not self.fp4 else 0)

    def write(self, pages: torch.Tensor, offs: torch.Tensor, rows: torch.Tensor, fused: bool = False) -> None:
        """rows -> slots (pages, offs), quantised for FP8 / FP4 storage. fused (kernel mode, CUDA, quantised
        pools): one Triton launch (`dsv4.kernels.cache_store.store_rows`) instead of ~12 torch ops; the rows
        stored dequantise to the same values (FP8: lossless re-quantisation of simulated rows)."""
        if fused and (self.fp8 or self.fp4) and (rows.is_cuda or interpreted()):
            from dsv4.kernels.cache_store import store_rows
            store_rows(rows, pages, offs, self)
            return
        if self.fp4:
            q, s = quantize_mxfp4(rows.float(), name="indexer key", validate=False)
            self.q[pages, offs] = q
            self.s[pages, offs] = s.view(torch.uint8)
            return
        if not self.fp8:
            self.data[pages, offs] = rows.to(self.data.dtype)
            return
        q, s = quantize_act(rows[:, : self.nope].float(), block=KV_BLOCK)
        self.q[pages, offs] = q
        self.s[pages, offs] = ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)  # pow2 -> exponent byte
        self.rope[pages, offs] = rows[:, self.nope:].to(self.rope.dtype)

    def read(self, pages: torch.Tensor, offs: torch.Tensor, dtype, fused: bool = False,
             tail: torch.Tensor | None = None) -> torch.Tensor:
        """The rows at slots (pages, offs), dequantised to dtype, then tail's rows if given. fused (kernel mode, CUDA,
        quantised pools, bf16, 1-D slots): one Triton launch (`cache_store.load_rows`, the same bits) instead of
        ≈ 16 torch ops and the cat."""
        if fused and (self.fp8 or self.fp4) and dtype == torch.bfloat16 and pages.dim() == 1 \
                and (pages.is_cuda or interpreted()) and (tail is None or tail.dtype == dtype):
            from dsv4.kernels.cache_store import load_rows
            if tail is not None and tail.stride(-1) != 1:  # (the kernel steps along a row with unit stride)
                tail = tail.contiguous()
            return load_rows(pages, offs, self, tail=tail)
        rows = self._read(pages, offs, dtype)
        return rows if tail is None else torch.cat((rows, tail.to(dtype)))

    def _read(self, pages: torch.Tensor, offs: torch.Tensor, dtype) -> torch.Tensor:
        """`read`'s torch path (no tail)."""
        if self.fp4:
            q, s = self.q[pages, offs], self.s[pages, offs]
            return dequantize_mxfp4(q.flatten(0, -2), s.flatten(0, -2), dtype=torch.float32).view(
                *q.shape[:-1], self.width).to(dtype)
        if not self.fp8:
            return self.data[pages, offs].to(dtype)
        scale = e8m0_to_float(self.s[pages, offs]).repeat_interleave(KV_BLOCK, dim=-1)
        nope = self.q[pages, offs].float() * scale
        return torch.cat((nope.to(dtype), self.rope[pages, offs].to(dtype)), dim=-1)


def largest_slot(lo: int, hi: int, ring: int) -> int:
    """The largest of the ring slots p mod ring of positions lo .. hi - 1 (hi > lo), on the host."""
    wraps = hi - lo >= ring or lo % ring > (hi - 1) % ring
    return ring - 1 if wraps else (hi - 1) % ring


def entry_bytes(width: int, nope: int, fp8: bool, fp4: bool, elem: int) -> int:
    """Bytes of one stored entry: plain, FP8 (e4m3 nope + E8M0 per 64 + pad + rope), or MXFP4."""
    if fp4:
        return width // 2 + width // 32
    if fp8:
        return nope + nope // KV_BLOCK + 1 + (width - nope) * elem
    return width * elem


def cache_bytes_per_token(config: ModelConfig, kv_dtype: str = "auto", dtype: torch.dtype = torch.bfloat16
                          ) -> dict[str, float]:
    """Asymptotic cache bytes per token of context, per kind (window ring and state are fixed-size)."""
    elem = torch.empty(0, dtype=dtype).element_size()
    fp8 = kv_dtype == "fp8"
    out: dict[str, float] = {}
    for spec in config.layers:
        if not spec.has_compressor:
            continue
        r = spec.compress_ratio
        main = entry_bytes(config.head_dim, config.nope_dim, fp8, False, elem)
        out[f"compressed{r}"] = out.get(f"compressed{r}", 0.0) + main / r
        if spec.has_indexer:
            idx = entry_bytes(config.index_head_dim, config.index_head_dim, False, fp8, elem)
            out["indexer4"] = out.get("indexer4", 0.0) + idx / r
    return out


class PagedPools:
    def __init__(self, config: ModelConfig, block_manager: BlockManager, *, dtype: torch.dtype,
                 device: torch.device, max_rollback: int, kv_dtype: str = "auto"):
        if kv_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_dtype={kv_dtype!r}; allowed: auto, fp8")
        self.config, self.bm, self.dtype, self.device = config, block_manager, dtype, device
        self.max_rollback = max_rollback
        self._page_views = None  # dsv4.kernels.page_copy.PageViews, made at the first copy
        self.acc = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        fp8 = kv_dtype == "fp8"
        self.fp8 = fp8
        kinds = block_manager.kinds
        # one extra page per kind: the trash page, target of the writes a fixed-shape decode step
        # does not want (windows still open, graph padding rows); see dsv4.engine.paged_decode
        self.trash = {name: k.num_pages for name, k in kinds.items()}
        self.ring = config.window + max_rollback
        specs = list(config.layers) + ([config.mtp_layer] if config.num_nextn_predict_layers else [])
        self.window, self.entries, self.rows = {}, {}, {}
        for spec in specs:
            w = kinds["window"]
            self.window[spec.index] = _EntryPool(w.num_pages + 1, w.page_size, config.head_dim, config.nope_dim,
                                                 fp8, dtype, device)
            if spec.has_compressor:
                k = kinds[f"compressed{spec.compress_ratio}"]
                self.entries[spec.index, "main"] = _EntryPool(k.num_pages + 1, k.page_size, config.head_dim,
                                                              config.nope_dim, fp8, dtype, device)
                st = kinds["state"]
                c = 2 if spec.has_indexer else 1
                cap = self.rows_cap(spec)
                self.rows[spec.index, "main"] = torch.zeros(2, st.num_pages + 1, cap, c * config.head_dim,
                                                            dtype=self.acc, device=device)
                if spec.has_indexer:
                    k = kinds["indexer4"]
                    self.entries[spec.index, "index"] = _EntryPool(k.num_pages + 1, k.page_size, config.index_head_dim,
                                                                   config.index_head_dim, False, dtype, device,
                                                                   fp4=fp8)
                    self.rows[spec.index, "index"] = torch.zeros(2, st.num_pages + 1, cap, 2 * config.index_head_dim,
                                                                 dtype=self.acc, device=device)

    def rows_cap(self, spec: LayerSpec) -> int:
        """Raw compressor rows kept: the open window, (CSA) the previous one, and rollback slack."""
        r = spec.compress_ratio
        return 2 * r + self.max_rollback + (r if spec.has_indexer else 0)

    def bytes_per_token(self) -> dict[str, float]:
        """Asymptotic bytes per token of context per kind (fixed-size window/state excluded)."""
        out: dict[str, float] = {}
        for (layer, name), pool in self.entries.items():
            if layer == self.config.num_layers:
                continue
            ratio = self.config.layer(layer).compress_ratio
            kind = f"compressed{ratio}" if name == "main" else "indexer4"
            out[kind] = out.get(kind, 0.0) + pool.nbytes_per_slot() / ratio
        return out

    def fixed_bytes_per_sequence(self) -> dict[str, int]:
        window = sum(p.nbytes_per_slot() for p in self.window.values()) * self.ring
        state = sum(t[0, 0].numel() * t.element_size() * 2 for t in self.rows.values())
        return {"window": window, "state": state}

    def copy_pages(self, src: dict[str, list[int]], dst: dict[str, list[int]]) -> None:
        """Copy the contents of pages `src[kind][:len(dst[kind])]` into `dst[kind]`, in every layer's pools (a
        fork, dsv4.engine.prompt_sharing). Slots and entries live at the same page index in both tables. On the
        GPU (and under Triton's interpreter) one or two launches (`dsv4.kernels.page_copy`), else torch."""
        from ..kernels import page_copy
        fused = torch.device(self.device).type == "cuda" or interpreted()
        (page_copy.copy_pages if fused else page_copy.copy_pages_ref)(*self.page_lists(src, dst))

    def page_lists(self, src: dict[str, list[int]], dst: dict[str, list[int]]):
        """`copy_pages`'s arguments for `dsv4.kernels.page_copy`: the pools' byte views (made once), and the source
        and destination pages per kind in their order."""
        from ..kernels.page_copy import PageViews
        if self._page_views is None:
            self._page_views = PageViews(self._byte_views())
        for kind, pages in dst.items():
            if len(src.get(kind, ())) < len(pages):
                raise ValueError(f"copy_pages: {kind} has {len(src.get(kind, ()))} source pages for {len(pages)}")
        kinds = list(self.bm.kinds)
        return (self._page_views, [list(src[k][: len(dst[k])]) if k in dst else [] for k in kinds],
                [list(dst.get(k, ())) for k in kinds])

    def _byte_views(self) -> list[tuple[int, torch.Tensor]]:
        """Every pool tensor as (kind index, [pages, page_bytes] uint8), the page along dim 0."""
        kinds = list(self.bm.kinds)

        def pages(t: torch.Tensor) -> torch.Tensor:
            return t.view(torch.uint8).reshape(t.shape[0], -1)

        views = [(kinds.index("window"), pages(t)) for pool in self.window.values() for t in pool.tensors()]
        for (layer, name), pool in self.entries.items():
            kind = f"compressed{self.config.layer(layer).compress_ratio}" if name == "main" else "indexer4"
            views += [(kinds.index(kind), pages(t)) for t in pool.tensors()]
        return views + [(kinds.index("state"), pages(buf[half])) for buf in self.rows.values() for half in (0, 1)]

    def nbytes(self) -> int:
        """Device bytes of every pool tensor: the cache's memory."""
        return sum(v.numel() for _, v in self._byte_views())

    def decode_step(self, size: int, num_tokens: int):
        """A fixed-shape decode step of `size` rows whose contexts reach at most `num_tokens` tokens."""
        return DecodeStep(self, size, DecodeStep.entry_pages_for(self, num_tokens))

    def new_state(self, seq):
        from ..model.state import SequenceState
        layers = [PagedLayerState(self, spec, seq) for spec in self.config.layers]
        mtp = PagedLayerState(self, self.config.mtp_layer, seq) if self.config.num_nextn_predict_layers else None
        return SequenceState(layers, mtp)


class PagedLayerState:
    def __init__(self, pools: PagedPools, spec: LayerSpec, seq):
        self.pools, self.spec, self.seq = pools, spec, seq
        self.dtype = pools.dtype
        self.window_size = pools.config.window
        self.max_rollback = pools.max_rollback
        self.ratio = spec.compress_ratio
        self.overlap = spec.compress_ratio == 4
        self.num_tokens = 0
        self.min_length = 0
        self._n_entries = {}
        self._first = {}
        self._rows_cap = pools.rows_cap(spec)  # fixed per layer: `advance_decode` runs per layer and step
        if spec.has_compressor:
            self._n_entries["main"], self._first["main"] = 0, 0
            if spec.has_indexer:
                self._n_entries["index"], self._first["index"] = 0, 0

    def fork(self, seq) -> "PagedLayerState":
        """A state of the same length and counters for `seq`, whose pages hold copies of this one's
        (`PagedPools.copy_pages`)."""
        other = PagedLayerState(self.pools, self.spec, seq)
        other.num_tokens, other.min_length = self.num_tokens, self.min_length
        other._n_entries, other._first = dict(self._n_entries), dict(self._first)
        return other

    # ---- addressing ----------------------------------------------------------------------
    def _table(self, kind: str) -> torch.Tensor:
        """The block table on the device, copied again only when it changed: a pageable host->device
        copy waits for the GPU queue to drain (10 such waits made a prefill mostly host-bound). Kept on the
        sequence, so one copy serves all its layers (their states share its tables) and its later steps."""
        pages = self.seq.block_tables[kind]
        hit = self.seq.device_tables.get(kind)
        if hit is None or hit[0] != pages:
            table = torch.tensor(pages, dtype=torch.long)
            if torch.device(self.pools.device).type == "cuda":
                table = table.pin_memory().to(self.pools.device, non_blocking=True)
            hit = self.seq.device_tables[kind] = (list(pages), table)
        return hit[1]

    def _slots(self, kind: str, lo: int, hi: int, page_size: int, ring: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset) of slot indices lo .. hi - 1 (hi > lo), each taken mod `ring` when given. The layers
        of a sequence ask for the same slots within a forward, so the lists are derived once per forward (four
        launches fewer per read or write and layer; `rope.once_per_forward`), from the table tensor current then."""
        table = self._table(kind)
        return self._once((kind, lo, hi, page_size, ring, id(table)),
                          lambda: self._derive_slots(table, kind, lo, hi, page_size, ring), table)

    def _once(self, key: tuple, make, table=None):
        """make() once per key for all layers of the sequence within one forward. The entry keeps the sequence and
        the table alive, so their ids in the key stay unique meanwhile."""
        return rope.once_per_forward(("paged", id(self.seq)) + key, lambda: (self.seq, table, make()))[2]

    def _derive_slots(self, table: torch.Tensor, kind: str, lo: int, hi: int, page_size: int, ring: int):
        top = largest_slot(lo, hi, ring) if ring else hi - 1
        pages = self.seq.block_tables[kind]
        if top // page_size >= len(pages):  # (checked on the host: no value read back from the device)
            raise RuntimeError(f"layer {self.spec.index}: {kind} index {top} beyond the "
                               f"{len(pages)} pages allocated to request {self.seq.request_id!r}")
        index = torch.arange(lo, hi, device=self.pools.device)
        if ring:
            index = index % ring
        return table[index // page_size], index % page_size

    def _entry_kind(self, name: str) -> str:
        return f"compressed{self.ratio}" if name == "main" else "indexer4"

    def _state_page(self) -> int:
        return self.seq.block_tables["state"][0]

    # ---- reads ---------------------------------------------------------------------------
    def window(self, fused: bool = False, tail: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.num_tokens
        lo = max(0, end - self.window_size + 1)
        positions = self._once(("positions", lo, end), lambda: torch.arange(lo, end, device=self.pools.device))
        pool = self.pools.window[self.spec.index]
        if positions.numel() == 0:
            empty = torch.empty(0, pool.width, dtype=self.pools.dtype, device=self.pools.device)
            return (empty if tail is None else tail), positions
        pages, offs = self._slots("window", lo, end, pool.page_size, self.pools.ring)
        return pool.read(pages, offs, self.pools.dtype, fused, tail=tail), positions

    def compressor_ring(self, name: str) -> tuple[tuple, int]:
        """((C ring, Z ring, start, count), first): the rows of positions first .. num_tokens - 1 are ring rows
        start, start + 1, ... (mod its length) of this sequence's state page (`cache_store.ring_rows`); views, valid
        until the next `append_tokens`. The kernel-mode pooling reads them where they are."""
        first, end = self._first[name], self.num_tokens
        buf = self.pools.rows[self.spec.index, name]
        page, cap = self._state_page(), buf.shape[2]
        return (buf[0, page], buf[1, page], first % cap, end - first), first

    def entries(self, name: str, fused: bool = False) -> torch.Tensor:
        n = self._n_entries[name]
        pool = self.pools.entries[self.spec.index, name]
        if n == 0:
            return torch.empty(0, pool.width, dtype=self.pools.dtype, device=self.pools.device)
        pages, offs = self._slots(self._entry_kind(name), 0, n, pool.page_size)
        return pool.read(pages, offs, self.pools.dtype, fused)

    def num_entries(self, name: str) -> int:
        return self._n_entries[name]

    # ---- writes --------------------------------------------------------------------------
    def append_entries(self, name: str, entries: torch.Tensor) -> None:
        self.append_stored(name, entries.shape[0], lambda pages, offs, pool: pool.write(pages, offs, entries))

    def stores_fused(self, name: str) -> bool:
        """Whether `append_stored` can take `cache_store.store_rows` (its pool is FP8 / FP4 on CUDA)."""
        pool = self.pools.entries[self.spec.index, name]
        return (pool.fp8 or pool.fp4) and (torch.device(self.pools.device).type == "cuda" or interpreted())

    def append_stored(self, name: str, k: int, store) -> None:
        """Append k entries that `store(pages, offs, pool)` writes into their slots (kernel mode: the
        compressor's finish and the store in one launch)."""
        if k == 0:
            return
        n = self._n_entries[name]
        pool = self.pools.entries[self.spec.index, name]
        pages, offs = self._slots(self._entry_kind(name), n, n + k, pool.page_size)
        store(pages, offs, pool)
        self._n_entries[name] = n + k

    def append_tokens(self, kv: torch.Tensor, rows: dict[str, tuple[torch.Tensor, torch.Tensor]],
                      fused: bool = False) -> None:
        n = kv.shape[0]
        start, end = self.num_tokens, self.num_tokens + n
        if set(rows) != set(self._first):
            raise ValueError(f"layer {self.spec.index}: expected compressor rows {sorted(self._first)}, "
                             f"got {sorted(rows)}")
        ring = self.pools.ring
        keep = min(n, ring)
        pool = self.pools.window[self.spec.index]
        pages, offs = self._slots("window", end - keep, end, pool.page_size, ring)
        pool.write(pages, offs, kv[n - keep:], fused)
        self.min_length = max(self.min_length, end - self.max_rollback)
        keep_from = oldest_needed_row(self.ratio, self.overlap, self.min_length)
        copies = []
        for name, (c, z) in rows.items():
            buf = self.pools.rows[self.spec.index, name]
            cap = buf.shape[2]
            lo = max(start, end - cap)  # rows older than the ring are never read again
            page, s0, k = self._state_page(), lo % cap, end - lo
            head = min(k, cap - s0)  # ring slots s0.. up to its end, then from 0: plain copies, no index lists
            for part, src in enumerate((c[lo - start:], z[lo - start:])):
                copies.append((buf[part, page, s0:s0 + head], src[:head]))
                if k > head:
                    copies.append((buf[part, page, :k - head], src[head:]))
            self._first[name] = max(self._first[name], keep_from, end - cap)
            if self._n_entries[name] != end // self.ratio:
                raise RuntimeError(f"layer {self.spec.index}: {self._n_entries[name]} {name} entries after "
                                   f"{end} tokens (expected {end // self.ratio})")
        if copies:  # every compressor's C and Z rows: one multi-tensor launch on a GPU instead of one per copy
            torch._foreach_copy_([d for d, _ in copies], [src for _, src in copies])
        self.num_tokens = end

    def advance_decode(self, n: int = 1) -> None:
        """Count n tokens whose kv, rows and (closed windows') entries a fixed-shape step
        (dsv4.engine.paged_decode) has written: the bookkeeping half of `append_tokens`."""
        end = self.num_tokens + n
        self.num_tokens = end
        if end - self.max_rollback > self.min_length:
            self.min_length = end - self.max_rollback
        if self._first:  # runs for every layer of every sequence each step (43 x B at Flash): kept lean
            lo = max(oldest_needed_row(self.ratio, self.overlap, self.min_length), end - self._rows_cap)
            entries = end // self.ratio
            first = self._first
            for name in first:
                self._n_entries[name] = entries
                if lo > first[name]:
                    first[name] = lo

    def truncate(self, num_tokens: int) -> None:
        target = truncate_target(self, num_tokens)
        for name in self._first:
            self._n_entries[name] = min(self._n_entries[name], target // self.ratio)
        self.num_tokens = target
