"""A decode step over the paged pools as fixed-shape tensor work: no per-sequence Python inside the
model and no device->host reads, so a whole step can be one CUDA graph (dsv4.model.graphs).

Each row is one token at position t (a decode batch: one row per sequence; an MTP verify batch: a
sequence's token and its drafts, up to `max_rollback + 1` rows, each with the sequence's tables). The
host ships the positions and the block tables once per step (one copy that the host does not wait
for; tables padded with each kind's trash page, see `PagedPools.trash`); `derive` turns
them into every slot index the layers use, once per step, shared by all layers of a kind:

  window ring   write: slot t mod ring;  read: positions t-W+1 .. t (the new kv is written first)
  raw rows      write: slot t mod cap;   read: the window containing t (CSA: and the one before)
  entries       write: entry t // r if t closes its window, else the trash page (at slot row mod page size:
                up to a page's worth of rows never race for one slot, so the step's bytes do not depend on
                the GPU's program order);
                read: entries 0 .. N-1 of the table width, present where < (t+1) // r

So the compressor is branch-free: every row pools the window containing its t (from the rows written
so far) and the result lands in the trash page unless t closes that window, the moment the
per-sequence path would pool it. Every write of a layer (all rows) precedes its reads, so a row sees
the kv, rows and entries of the earlier tokens of its own sequence in the same step; the ring slack
(`max_rollback`) keeps a later row from overwriting what an earlier one still reads. Graph padding rows
(position 0, tables all trash) only write to trash pages.
Every pool is zero-filled and only finite values are written, so masked reads of padding or trash
slots contribute exact zeros.
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch

# The slots the decode kernels read (window write, raw-row ring, entry writes, entry positions and counts) are
# computed on the host in `fill` (numpy, `_derive`'s integer formulas) and shipped in the step's one host->device
# copy, instead of ≈ 60 small device ops at the first layer of each kind. Measured (session 21, 8 Flash layers,
# one H200): graph replay 1.41 -> 1.31 ms at B = 1, 3.28 -> 3.20 at B = 8; a step read back before the next
# 2.18 -> 2.07 / 4.21 -> 4.20. The host pays ≈ 70 µs more in `fill` at B = 1 on the 2-core dev machine.
# DSV4_HOST_SLOTS=0 restores the device derivation (A/Bs; the CPU tests check both agree).
HOST_SLOTS = os.environ.get("DSV4_HOST_SLOTS", "1") == "1"


def _views(flat, layout: list[tuple]) -> dict:
    """{key: view of `flat` with that shape} for `layout` [(key, shape)], laid out one after the other."""
    out, at = {}, 0
    for key, shape in layout:
        n = math.prod(shape)
        out[key] = flat[at:at + n].reshape(shape)
        at += n
    return out


class DecodeStep:
    """Static index buffers of a `size`-row decode batch; `entry_pages[kind]` = table width of each
    entry kind (the context the step can hold: width * page_size * ratio tokens)."""

    def __init__(self, pools, size: int, entry_pages: dict[str, int]):
        self.pools, self.size = pools, size
        self.config, self.fp8 = pools.config, pools.fp8
        self.kinds = pools.bm.kinds
        self.widths = {}
        for name, kind in self.kinds.items():
            if name == "window":
                self.widths[name] = math.ceil(pools.ring / kind.page_size)
            elif name == "state":
                self.widths[name] = 1
            else:
                self.widths[name] = max(1, entry_pages[name])
        plan = self._slot_plan() if HOST_SLOTS else []
        # one flat layout, on the device (`_dev`) and on the host (`_image`, what `_dev` must hold after `fill`):
        # positions, each kind's table [size, width], then the host-computed slot arrays (see HOST_SLOTS)
        layout = [("pos", (size,))] + [(name, (size, w)) for name, w in self.widths.items()] + plan
        total = sum(math.prod(shape) for _, shape in layout)
        dev = pools.device
        self._dev = torch.zeros(total, dtype=torch.long, device=dev)
        self._image = np.empty(total, dtype=np.int64)
        views, images = _views(self._dev, layout), _views(self._image, layout)
        self.pos, self._image_pos = views["pos"], images["pos"]
        self.tables = {name: views[name] for name in self.widths}
        self._image_tables = {name: images[name] for name in self.widths}
        for name, table in self._image_tables.items():
            table[:] = pools.trash[name]
        self._slots = {key: views[key] for key, _ in plan}
        self._slot_image = {key: images[key] for key, _ in plan}
        self._rows_keys = [key[:4] for key, _ in plan if key[0] == "rows" and key[-1] == 0]
        self._ratios = [key[1] for key, _ in plan if key[0] == "count"]
        self._derived: dict = {}
        # per entry kind, the step-independent part of its "read" slots (`_derive`), built on first use and kept
        # across `derive()`: a captured step's graph (one DecodeStep per bucket) derives only the rest per step
        self._entry_columns: dict = {}
        # a table row is rewritten only when its pages change (`_row_pages`: the pages row r holds, [] = all
        # trash: padding rows, and kinds the step's layers never touch)
        self._row_pages = {name: [[] for _ in range(size)] for name in self.widths}
        self._kinds: dict[bool, list[tuple]] = {}  # mtp -> `_kind_rows`
        # Two pinned staging buffers, used in turn, each with the event of its last copy: the copy to
        # the device does not block, and a buffer is refilled only after its previous copy has run.
        self._cuda = dev.type == "cuda"
        self._staging: list = [None, None]
        self._copied: list = [None, None]
        self._turn = 0

    def _rows_key(self, spec) -> tuple:
        r = spec.compress_ratio
        return ("rows", r, r == 4, self.pools.rows_cap(spec))

    def _entry_kinds(self) -> list[str]:
        return [name for name in self.kinds if name not in ("window", "state")]

    def _slot_plan(self) -> list[tuple[tuple, tuple[int, ...]]]:
        """(key, shape) of every host-computed slot array: the window write's (page, offset); per raw-row ring
        (ratio, overlap, capacity) the token's slot and its window's slots; per entry kind the write's
        (page, offset); per ratio the entry position and the complete-entry count."""
        n = self.size
        plan = [(("window_write", 0), (n,)), (("window_write", 1), (n,))]
        specs = list(self.config.layers) + [s for s in (self.config.mtp_layer,) if s is not None]
        for key in sorted({self._rows_key(spec) for spec in specs if spec.has_compressor}):
            plan += [(key + (0,), (n,)), (key + (1,), (n, (2 if key[2] else 1) * key[1]))]
        for name in self._entry_kinds():
            plan += [((name, "write", 0), (n,)), ((name, "write", 1), (n,))]
        for r in sorted({self.kinds[name].ratio for name in self._entry_kinds()}):
            plan += [(("entry_pos", r), (n,)), (("count", r), (n,))]
        return plan

    def _fill_slots(self) -> None:
        """The host-computed slot arrays from the image's positions and tables: `_derive`'s formulas."""
        t, img = self._image_pos, self._slot_image
        rows = np.arange(self.size)
        ring, wps = self.pools.ring, self.kinds["window"].page_size
        slot = t % ring
        img["window_write", 0][:] = self._image_tables["window"][rows, slot // wps]
        img["window_write", 1][:] = slot % wps
        for key in self._rows_keys:
            _, r, overlap, cap = key
            img[key + (0,)][:] = t % cap
            first = (t // r) * r - (r if overlap else 0)
            img[key + (1,)][:] = np.maximum(first[:, None] + np.arange((2 if overlap else 1) * r), 0) % cap
        for r in self._ratios:  # once per ratio (CSA's main and indexer entries share ratio 4)
            img["entry_pos", r][:] = t // r * r
            img["count", r][:] = (t + 1) // r
        for name in self._entry_kinds():
            kind, table = self.kinds[name], self._image_tables[name]
            i = t // kind.ratio
            page = table[rows, np.minimum(i // kind.page_size, table.shape[1] - 1)]
            closes = (t + 1) % kind.ratio == 0
            img[name, "write", 0][:] = np.where(closes, page, self.pools.trash[name])
            img[name, "write", 1][:] = np.where(closes, i, rows) % kind.page_size

    @staticmethod
    def entry_pages_for(pools, num_tokens: int) -> dict[str, int]:
        """Entry-table widths that hold a context of `num_tokens` tokens."""
        return {name: math.ceil(num_tokens // k.ratio / k.page_size)
                for name, k in pools.bm.kinds.items() if name not in ("window", "state")}

    def _kind_rows(self, mtp: bool) -> list[tuple]:
        """Per kind: (name, width, kind, trash page, image rows, held pages, used by these layers)."""
        if mtp not in self._kinds:
            specs = [self.config.mtp_layer] if mtp else self.config.layers
            used = {"window"} | {k for spec in specs if spec.has_compressor
                                 for k in (f"compressed{spec.compress_ratio}", "state")} \
                | {"indexer4" for spec in specs if spec.has_indexer}
            self._kinds[mtp] = [(name, w, self.kinds[name], self.pools.trash[name], self._image_tables[name],
                                 self._row_pages[name], name in used) for name, w in self.widths.items()]
        return self._kinds[mtp]

    # ---- host ----------------------------------------------------------------------------
    def fill(self, states: list, lens: list[int] | None = None, mtp: bool = False) -> None:
        """Positions and block tables of `states` (SequenceStates over these pools) into the static
        buffers: sequence b brings lens[b] tokens (default 1), one row each, in batch order; rows
        beyond them become padding. `mtp`: positions continue the MTP block's state. The copy to the
        device is queued on the current stream, not waited for."""
        lens = [1] * len(states) if lens is None else [int(n) for n in lens]
        done = [(s.mtp if mtp else s).num_tokens for s in states]
        rows = sum(lens)
        if rows > self.size:
            raise ValueError(f"DecodeStep: {rows} tokens for a step of {self.size} rows")
        self._image_pos[:rows] = [t + j for t, n in zip(done, lens) for j in range(n)]
        if rows < self.size:
            self._image_pos[rows:] = 0
        kinds = self._kind_rows(mtp)
        r0 = 0
        for s, n, t in zip(states, lens, done):
            seq, end = s.layers[0].seq, t + n
            for name, w, kind, trash, image, held, used in kinds:
                pages = []  # kinds these layers never touch: all trash
                if used:
                    pages = seq.block_tables.get(name, pages)
                    if len(pages) > w:
                        pages = pages[:w]
                    if kind.pages_needed(end) > len(pages):
                        raise RuntimeError(f"request {seq.request_id!r}: position {end - 1} needs "
                                           f"{kind.pages_needed(end)} {name} pages; {len(pages)} usable "
                                           f"(allocated {len(seq.block_tables.get(name, ()))}, step holds {w})")
                for r in range(r0, r0 + n):
                    if held[r] != pages:  # rewritten only when this row's pages changed
                        image[r, :len(pages)] = pages
                        image[r, len(pages):] = trash
                        held[r] = list(pages)  # a copy: the sequence's list grows in place
            r0 += n
        for name, w, kind, trash, image, held, used in kinds:
            for r in range(rows, self.size):  # padding rows: all trash
                if held[r]:
                    image[r] = trash
                    held[r] = []
        if self._slots:
            self._fill_slots()
        self._upload()

    def _upload(self) -> None:
        """`_image` -> the device buffer through the next staging buffer, without waiting for the copy
        (on the host: a plain copy)."""
        i = self._turn
        self._turn = 1 - i
        if self._staging[i] is None:
            buf = torch.empty(self._image.shape[0], dtype=torch.long, pin_memory=self._cuda)
            self._staging[i] = (buf, buf.numpy())
            self._copied[i] = torch.cuda.Event() if self._cuda else None
        elif self._copied[i] is not None:
            self._copied[i].synchronize()  # its copy two fills ago has run (almost always long done)
        buf, view = self._staging[i]
        view[:] = self._image
        self._dev.copy_(buf, non_blocking=True)
        if self._copied[i] is not None:
            self._copied[i].record()

    # ---- device (inside the graph) ---------------------------------------------------------
    def derive(self) -> None:
        """Start a step: every slot index is derived from the static buffers (device ops only) on its first
        use in the step and shared by the later layers -- inside a captured step, in its graph. Slots no
        layer asks for are never built (the kernel path reads the window ring and the attended entries
        through the tables themselves: their gather tables would be about 20 launches per step for nothing)."""
        self._derived = {}

    def _get(self, key):
        """The step's slots `key` ("window_write", "window_read", "state_page", (kind, "write" | "read"),
        ("count" | "entry_pos", ratio)), derived on first use."""
        if key not in self._derived:
            self._derived[key] = self._derive(key)
        return self._derived[key]

    def _derive(self, key):
        t, dev = self.pos, self._dev.device
        if self._slots:  # HOST_SLOTS: views of what `fill` shipped
            if key == "window_write" or (isinstance(key, tuple) and key[-1] == "write"):
                head = key if isinstance(key, tuple) else (key,)
                return self._slots[head + (0,)], self._slots[head + (1,)]
            if key in self._slots:
                return self._slots[key]
        if key == "state_page":
            return self.tables["state"][:, 0]
        if key in ("window_write", "window_read"):
            ring, ps, wt = self.pools.ring, self.kinds["window"].page_size, self.tables["window"]
            if key == "window_write":  # (page, offset) [B] of position t
                slot = t % ring
                return wt.gather(1, (slot // ps)[:, None])[:, 0], slot % ps
            w = self.config.window  # (page, offset, exists) [B, W] of positions t-W+1 .. t
            p = t[:, None] - (w - 1) + torch.arange(w, device=dev)[None, :]
            slot = p.clamp(min=0) % ring
            return wt.gather(1, slot // ps), slot % ps, p >= 0
        what, arg = key
        if what == "count":  # complete entries of ratio `arg` [B]
            return (t + 1) // arg
        if what == "entry_pos":  # position i*r of the entry the window containing t becomes [B]
            return t // arg * arg
        kind = self.kinds[what]
        r, ps, table = kind.ratio, kind.page_size, self.tables[what]
        width = table.shape[1]
        if arg == "write":  # (page, offset) [B] of entry t // r: the trash page unless t closes its window
            i = t // r
            page = table.gather(1, (i // ps).clamp(max=width - 1)[:, None])[:, 0]
            closes = (t + 1) % r == 0
            rows = torch.arange(len(t), device=dev)
            return torch.where(closes, page, self.pools.trash[what]), torch.where(closes, i, rows) % ps
        if what not in self._entry_columns:  # entry slot j, its table column and its offset in the page [B, N]
            j = torch.arange(width * ps, device=dev)
            self._entry_columns[what] = (j[None, :], j // ps, (j % ps)[None, :].expand(self.size, -1))
        j, column, offset = self._entry_columns[what]  # "read": (page, offset, complete) [B, N] of every entry slot
        return table[:, column], offset, j < self._get(("count", r))[:, None]

    def _rows_slots(self, ratio: int, overlap: bool, cap: int):
        key = ("rows", ratio, overlap, cap)
        if key not in self._derived and key + (0,) in self._slots:
            self._derived[key] = (self._slots[key + (0,)], self._slots[key + (1,)], self.pos >= ratio)
        if key not in self._derived:
            t = self.pos
            first = (t // ratio) * ratio - (ratio if overlap else 0)
            p = first[:, None] + torch.arange((2 if overlap else 1) * ratio, device=t.device)[None, :]
            self._derived[key] = (t % cap, p.clamp(min=0) % cap, t >= ratio)
        return self._derived[key]

    # ---- per layer -------------------------------------------------------------------------
    def write_kv(self, layer: int, kv: torch.Tensor) -> None:
        self.pools.window[layer].write(*self._get("window_write"), kv)

    def window_keys(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of positions t-W+1 .. t [B, W, Dh] and which of them exist [B, W]."""
        page, off, valid = self._get("window_read")
        return self.pools.window[layer].read(page, off, self.pools.dtype), valid

    def _rows(self, layer: int, name: str):
        spec = self.config.layer(layer)
        cap = self.pools.rows_cap(spec)
        return self.pools.rows[layer, name], self._rows_slots(spec.compress_ratio, spec.compress_ratio == 4, cap)

    def rows_window(self, layer: int, name: str):
        """(state pool [2, pages, cap, w], state page [B], window slots [B, R], has_prev [B]) for kernels."""
        buf, (_, slots, has_prev) = self._rows(layer, name)
        return buf, self._get("state_page"), slots, has_prev

    def row_slot(self, layer: int, name: str) -> torch.Tensor:
        """[B] ring slot of the state pool where this step's (C, Z) rows go (`write_rows`' slot)."""
        return self._rows(layer, name)[1][0]

    def kv_slot(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._get("window_write")

    def entry_slot(self, layer: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset) [B] where this step's entry goes (the trash page unless t closes a window)."""
        return self._get((self._entry_kind(layer, name), "write"))

    def write_rows(self, layer: int, name: str, c: torch.Tensor, z: torch.Tensor) -> None:
        buf, (slot, _, _) = self._rows(layer, name)
        page = self._get("state_page")
        buf[0, page, slot] = c.to(buf.dtype)
        buf[1, page, slot] = z.to(buf.dtype)

    def window_rows(self, layer: int, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw (C, Z) rows [B, R, w] of the window containing t (CSA: R = 2r, the previous window
        first) and, for CSA, whether that previous window exists [B]."""
        buf, page, slots, has_prev = self.rows_window(layer, name)
        return buf[0, page[:, None], slots], buf[1, page[:, None], slots], has_prev

    def entry_positions(self, ratio: int) -> torch.Tensor:
        """Position i*r of the entry the window containing t becomes (its RoPE position)."""
        return self._get(("entry_pos", ratio))

    def _entry_kind(self, layer: int, name: str) -> str:
        r = self.config.layer(layer).compress_ratio
        return f"compressed{r}" if name == "main" else f"indexer{r}"

    def write_entries(self, layer: int, name: str, entries: torch.Tensor) -> None:
        page, off = self._get((self._entry_kind(layer, name), "write"))
        self.pools.entries[layer, name].write(page, off, entries)

    def entries(self, layer: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """All entry slots of the tables [B, N, d] and which hold complete entries [B, N]."""
        page, off, present = self._get((self._entry_kind(layer, name), "read"))
        return self.pools.entries[layer, name].read(page, off, self.pools.dtype), present

    def entry_read_slots(self, layer: int, name: str):
        """(pool, page [B, N], offset [B, N], present [B, N]): the slots `entries` reads, for kernels
        that read the pool themselves."""
        page, off, present = self._get((self._entry_kind(layer, name), "read"))
        return self.pools.entries[layer, name], page, off, present

    def entries_at(self, layer: int, name: str, index: torch.Tensor) -> torch.Tensor:
        """Entries `index` [B, K] (values in 0 .. N-1) -> [B, K, d]."""
        kind = self._entry_kind(layer, name)
        ps, table = self.kinds[kind].page_size, self.tables[kind]
        return self.pools.entries[layer, name].read(table.gather(1, index // ps), index % ps, self.pools.dtype)

    def entry_count(self, ratio: int) -> torch.Tensor:
        return self._get(("count", ratio))
