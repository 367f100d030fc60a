"""KV compressor (spec §2.7): pools every `ratio` tokens into one entry.

Per token t: `C_t = wkv a_t`, `Z_t = wgate a_t + ape[t mod r]` (fp32). Ratio 128 (HCA): entry i is the
per-channel softmax(Z)-weighted sum of C over tokens [128i, 128i+128). Ratio 4 (CSA, overlapping):
rows are 2d wide; entry i pools the A halves [0:d) of window i-1 and the B halves [d:2d) of window i
(8 rows; entry 0's missing A rows have zero weight). Then: round to the model dtype, RMSNorm, RoPE at
position i*r on the trailing rope dims, and the numerics' FP8 (main) or Hadamard+FP4 (indexer keys)
simulation. Entry i exists once token i*r + r - 1 has been processed.
"""
from __future__ import annotations

import torch
from torch import nn

from dsv4.config import ModelConfig
from dsv4.kernels._triton import interpreted
from dsv4.kernels.cache_store import pool_chunk, ring_rows
from dsv4.model.linear import Linear
from dsv4.model.norm import RMSNorm
from dsv4.model.numerics import Numerics, acc_dtype, simulate_indexer_fp4, simulate_kv_fp8
from dsv4.model.rope import RotaryEmbedding, apply_rope, strided_positions
from dsv4.model.state import LayerState

# kernel mode (`update(fused=True)`): the windows a prefill chunk closes pooled by `cache_store.pool_chunk`, one
# launch instead of the cats, softmax, product and sum of `pool` (≈ 250 µs of GPU time per 8K CSA chunk, s29d)
# H200 s30a, 8K forward of 4 layers: kernels 804 -> 786, GPU 50.30 -> 50.07 ms (GPU-tested: the same entries)
FUSED_POOL = True


def pool_window(c: torch.Tensor, z: torch.Tensor, has_prev: torch.Tensor, ratio: int, dim: int) -> torch.Tensor:
    """One window per batch row: raw rows [B, R, w] (w = 2*dim for CSA: R = 2r with the previous
    window first, has_prev [B] False for entry 0; else R = r) -> pooled [B, dim] fp32, as
    `Compressor.pool` computes it."""
    if c.shape[-1] == 2 * dim:
        keep = has_prev[:, None, None]
        c = torch.cat((torch.where(keep, c[:, :ratio, :dim], 0.0), c[:, ratio:, dim:]), dim=1)
        z = torch.cat((torch.where(keep, z[:, :ratio, :dim], float("-inf")), z[:, ratio:, dim:]), dim=1)
    return (torch.softmax(z, dim=1) * c).sum(dim=1)


def _unit_strided(c: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """c / z as `cache_store.pool_chunk` reads them: unit column stride and equal strides (copies only otherwise)."""
    if c.stride(-1) != 1 or c.stride() != z.stride():
        return c.contiguous(), z.contiguous()
    return c, z


class Compressor(nn.Module):
    def __init__(self, config: ModelConfig, ratio: int, dim: int, rope: RotaryEmbedding,
                 dtype: torch.dtype, numerics: Numerics, kind: str):
        super().__init__()
        if kind not in ("main", "index"):
            raise ValueError(f"compressor kind {kind!r}")
        self.ratio, self.dim, self.kind = ratio, dim, kind
        self.overlap = ratio == 4
        width = (2 if self.overlap else 1) * dim
        self.rope_dim = config.rope_dim
        self.rope = rope
        self.numerics = numerics
        self.ape = nn.Parameter(torch.empty(ratio, width, dtype=acc_dtype(dtype)), requires_grad=False)
        self.wkv = Linear(config.hidden_size, width, dtype, numerics)
        self.wgate = Linear(config.hidden_size, width, dtype, numerics)
        self.norm = RMSNorm(dim, config.rms_norm_eps, dtype)

    def project(self, a: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw rows (C_t, Z_t + ape[t mod r]) of a flat batch, fp32."""
        acc = acc_dtype(a.dtype)
        c = self.wkv(a, out_dtype=acc)
        z = self.wgate(a, out_dtype=acc) + self.ape[positions % self.ratio]
        return c, z

    def pool(self, c: torch.Tensor, z: torch.Tensor, first: int, start: int, fused: bool = False,
             past: tuple | None = None) -> tuple[torch.Tensor, int]:
        """Pool the windows that complete among rows [first, first + len(c)), given that entries for
        positions < start exist already. Returns (pooled [n, d] fp32, index of the first new entry).
        past (a state's ring, as `cache_store.ring_rows` takes it): rows of positions first .. that come before
        c / z's (a later prompt chunk's). fused (kernel mode, CUDA): one launch (`cache_store.pool_chunk`, the
        decode step's pooling arithmetic), which reads the ring where it is."""
        r, d = self.ratio, self.dim
        end = first + c.shape[0] + (past[3] if past is not None else 0)
        i0, i1 = start // r, end // r
        n = i1 - i0
        if n <= 0:
            return c.new_zeros(0, d), i0
        if fused and c.dtype == torch.float32 and (c.is_cuda or interpreted()) \
                and (past is None or past[0].dtype == torch.float32):
            c, z = _unit_strided(c, z)  # (the halves of one projection's rows are taken as they are: the kernel
            if past is not None:        # reads with their row stride)
                past = (*_unit_strided(*past[:2]), *past[2:])
            return pool_chunk(c, z, first, i0, n, r, d, past=past), i0
        if past is not None:
            pc, pz = ring_rows(past)
            c, z = torch.cat((pc, c)), torch.cat((pz, z))
        own = slice(i0 * r - first, i1 * r - first)
        own_c, own_z = c[own].unflatten(0, (n, r)), z[own].unflatten(0, (n, r))
        if self.overlap:
            if i0 > 0:  # A halves of windows i0-1 .. i1-2
                prev = slice((i0 - 1) * r - first, (i1 - 1) * r - first)
                if prev.start < 0:
                    raise RuntimeError(f"compressor rows start at {first}, need {(i0 - 1) * r}")
                prev_c, prev_z = c[prev, :d].unflatten(0, (n, r)), z[prev, :d].unflatten(0, (n, r))
            else:  # entry 0 has no previous window: C = 0, Z = -inf (zero weight)
                prev_c = torch.cat((own_c.new_zeros(1, r, d), own_c[:-1, :, :d]))
                prev_z = torch.cat((own_z.new_full((1, r, d), float("-inf")), own_z[:-1, :, :d]))
            own_c = torch.cat((prev_c, own_c[..., d:]), dim=1)
            own_z = torch.cat((prev_z, own_z[..., d:]), dim=1)
        weights = torch.softmax(own_z, dim=1)
        return (weights * own_c).sum(dim=1), i0

    def pool_window(self, c: torch.Tensor, z: torch.Tensor, has_prev: torch.Tensor) -> torch.Tensor:
        return pool_window(c, z, has_prev, self.ratio, self.dim)

    def finish(self, pooled: torch.Tensor, first_entry: int, dtype: torch.dtype) -> torch.Tensor:
        """Pooled rows -> stored entries: round, norm, RoPE at i*r, quantisation simulation."""
        return self.finish_at(pooled, self._entry_positions(pooled, first_entry), dtype)

    def _entry_positions(self, pooled: torch.Tensor, first_entry: int) -> torch.Tensor:
        """RoPE positions i * r of the pooled entries first_entry, first_entry + 1, ... (one launch)."""
        r = self.ratio
        return strided_positions(first_entry * r, (first_entry + pooled.shape[0]) * r, r, pooled.device)

    def finish_at(self, pooled: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`finish` with each entry's RoPE position (i*r) given."""
        entries = self.norm(pooled.to(dtype))
        cos, sin = self.rope.cos_sin(positions)
        entries = apply_rope(entries, cos, sin)
        if self.kind == "main" and self.numerics.simulate_kv_fp8:
            entries = simulate_kv_fp8(entries, self.dim - self.rope_dim)
        if self.kind == "index" and self.numerics.simulate_indexer_fp4:
            entries = simulate_indexer_fp4(entries)
        return entries

    def update(self, state: LayerState, c_new: torch.Tensor, z_new: torch.Tensor, dtype: torch.dtype,
               fused: bool = False) -> None:
        """Append the entries that the chunk (c_new, z_new) of one sequence completes to `state`. fused
        (kernel mode): where the paged state's pool is quantised on CUDA, `finish` and the store run as one
        Triton launch (`cache_store.store_rows`, as the paged decode step stores its entries)."""
        if (state.num_tokens + c_new.shape[0]) // self.ratio == state.num_tokens // self.ratio:
            return  # no window closes in this chunk (most decode steps): nothing to read or pool
        past, first = state.compressor_ring(self.kind)
        past = past if past[3] else None  # (a fresh prompt has no rows yet; a later chunk's stay in the ring)
        pooled, first_entry = self.pool(c_new, z_new, first, state.num_tokens, fused=fused and FUSED_POOL, past=past)
        if not pooled.shape[0]:
            return
        if fused and dtype == torch.bfloat16 and self._finish_fuses() and state.stores_fused(self.kind):
            from dsv4.kernels.cache_store import store_rows
            from dsv4.model.numerics import hadamard_matrix
            cos, sin = self.rope.cos_sin(self._entry_positions(pooled, first_entry))
            had = hadamard_matrix(self.dim, torch.float32, pooled.device) if self.kind == "index" else None
            state.append_stored(self.kind, pooled.shape[0], lambda pages, offs, pool: store_rows(
                pooled, pages, offs, pool, norm_weight=self.norm.weight, eps=self.norm.eps, cos=cos, sin=sin,
                hadamard=had))
            return
        state.append_entries(self.kind, self.finish(pooled, first_entry, dtype))

    def _finish_fuses(self) -> bool:
        """Whether `finish` is what `store_rows` computes before quantising: the FP8 kv simulation (main) or the
        Hadamard + FP4 one (indexer keys) of the reference numerics."""
        return self.numerics.simulate_kv_fp8 if self.kind == "main" else self.numerics.simulate_indexer_fp4
