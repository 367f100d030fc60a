"""Rotary position embedding (spec §2.4): interleaved pairs on the *trailing* rope dims.

Pair i of the rope slice is `(x[2i], x[2i+1])`, rotated by the angle `p * omega_i`. Sliding-only
layers and the MTP block use base 10000 without YaRN; CSA/HCA layers use base 160000 with YaRN for
everything in the layer (q, window kv, compressed entries, indexer q and keys). There is no mscale.
Angles are built like DeepSeek's reference: fp32(p) * fp32(omega), rounded to fp32.
"""
from __future__ import annotations

import contextlib
import math

import torch

from dsv4.config import Rope, Yarn


def yarn_correction_range(rope_dim: int, theta: float, yarn: Yarn) -> tuple[int, int]:
    """(lo, hi) pair indices of the YaRN ramp; (15, 25) for the released compressed-layer numbers."""
    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi)) \
            / (2 * math.log(theta))
    lo = max(math.floor(correction_dim(yarn.beta_fast)), 0)
    hi = min(math.ceil(correction_dim(yarn.beta_slow)), rope_dim - 1)
    return lo, hi


def rope_frequencies(rope_dim: int, rope: Rope) -> torch.Tensor:
    """omega_i for i in [0, rope_dim/2), fp32, with the YaRN blend when `rope.yarn` is set."""
    omega = 1.0 / (rope.theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    if rope.yarn is None:
        return omega
    lo, hi = yarn_correction_range(rope_dim, rope.theta, rope.yarn)
    if hi == lo:
        hi += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    smooth = 1 - ramp  # same evaluation order as the reference (matters in the last fp32 bit)
    return omega / rope.yarn.factor * (1 - smooth) + omega * smooth


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the trailing `2 * cos.shape[-1]` dims of x; cos/sin broadcast against x[..., pairs].

    Math in cos.dtype (fp32/fp64), result in x.dtype. Pass -sin for the inverse rotation."""
    rope_dim = 2 * cos.shape[-1]
    pairs = x[..., -rope_dim:].to(cos.dtype).unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], rotated.to(x.dtype)), dim=-1)


class RotaryEmbedding:
    """cos/sin tables of one layer kind; `cos_sin(positions)` -> ([T, rope_dim/2], [T, rope_dim/2])."""

    def __init__(self, rope_dim: int, rope: Rope, acc: torch.dtype = torch.float32):
        self.rope_dim = rope_dim
        self.rope = rope
        self.acc = acc
        self.omega = rope_frequencies(rope_dim, rope)
        self._omega_on: dict[torch.device, torch.Tensor] = {}  # one copy per device: no transfer per call

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions must be < 2^24 (exact in fp32): `check_positions` once per forward, not here (no
        host sync per layer, and CUDA-graph capturable). Inside `shared_cos_sin()` the tables of one
        positions tensor are computed once for all layers of the same RoPE kind."""
        key = (self.rope_dim, self.rope, self.acc, id(positions))  # the entry holds positions: id stays unique
        return _kept(key, lambda: (positions, self._cos_sin(positions)))[1]

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        omega = self._omega_on.get(positions.device)
        if omega is None:
            omega = self._omega_on[positions.device] = self.omega.to(positions.device)
        # int positions x fp32 omega: promoted to fp32 inside the multiply (the same fp32(p) * omega bits as a cast
        # first, one launch fewer per table on the GPU)
        p = positions.to(torch.float32) if positions.is_floating_point() else positions
        angles = p[:, None] * omega[None, :]
        angles = angles.to(self.acc)
        return angles.cos(), angles.sin()


_shared: dict | None = None
# Derivations the layers of one forward share: the compressors' entry positions (and so their RoPE tables), the
# indexer's visible counts, the paged states' slot lists and positions (dsv4.engine.paged_state). False: each layer
# derives its own, as before session 62 (the A/B of bench/runs/run_device_s63c.sh).
SHARE_ACROSS_LAYERS = True


def _kept(key: tuple, make):
    """make() once per key inside `shared_cos_sin()`, else at every call. What is kept lives as long as the
    forward's scope: nothing carries over to the next forward."""
    if _shared is None:
        return make()
    hit = _shared.get(key)
    if hit is None:
        hit = _shared[key] = make()
    return hit


def once_per_forward(key: tuple, make):
    """`_kept` for the derivations SHARE_ACROSS_LAYERS governs (the layers of one forward ask alike)."""
    return _kept(key, make) if SHARE_ACROSS_LAYERS else make()


def strided_positions(start: int, stop: int, step: int, device) -> torch.Tensor:
    """arange(start, stop, step) on `device`, once per forward and range, so that the layers' `cos_sin` of it (the
    compressors' entry positions) is computed once too."""
    return once_per_forward(("positions", start, stop, step, torch.device(device)),
                            lambda: torch.arange(start, stop, step, device=device))


@contextlib.contextmanager
def shared_cos_sin():
    """Within one forward (positions not modified in between): one cos/sin table per RoPE kind, and what else the
    layers derive alike (`once_per_forward`)."""
    global _shared
    previous, _shared = _shared, {}
    try:
        yield
    finally:
        _shared = previous


MAX_POSITION = 1 << 24


def check_positions(max_position: int) -> None:
    if max_position >= MAX_POSITION:
        raise ValueError(f"position {max_position} is not exactly representable in fp32 (RoPE needs < 2^24)")
