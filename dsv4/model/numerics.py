"""The numerics switch: which low-precision roundings of DeepSeek's reference the model simulates.

`reference` (default) reproduces DeepSeek's inference code (spec deepseek_v4_model.md §2.6, §2.12,
checkpoint_format.md §7):

* KV simulation: the nope dims of every attention KV vector (window kv of every layer incl. MTP and
  every main-compressor entry) are FP8-e4m3 quantised and dequantised in blocks of 64 with pow2 scales,
  after kv_norm / entry norm and RoPE. The rope dims are left alone.
* Indexer simulation: indexer queries (after RoPE) and indexer keys (after norm and RoPE) are rotated
  by the normalised Sylvester-Hadamard matrix and FP4-e2m1 quantised/dequantised in blocks of 32.
* Activation quantisation: the input of every linear whose checkpoint weight is FP8 or FP4 (wq_a,
  wq_b, wkv, wo_b, indexer.wq_b, shared and routed experts, mtp e_proj/h_proj) is FP8-quantised per
  token per 128 channels (pow2 scales) and dequantised before the GEMM. Not wo_a, not the
  compressor/indexer bf16 projections, weights_proj, the router or the head.

`transformers` turns all three off (what transformers 5.23.0 computes when loaded dequantised).

A `Numerics` instance with any combination of the three flags is accepted wherever a name is.
Everything else is governed by the model dtype: the reference's "bf16" rounding points round to the
model dtype and its "fp32" computations run in `acc_dtype(dtype)` (fp32 for bf16/fp16 models,
float64 for float32/float64 models).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Numerics:
    name: str
    simulate_kv_fp8: bool
    simulate_indexer_fp4: bool
    quantize_activations: bool


NUMERICS = {
    "reference": Numerics("reference", True, True, True),
    "transformers": Numerics("transformers", False, False, False),
}


def resolve_numerics(numerics: str | Numerics) -> Numerics:
    if isinstance(numerics, Numerics):
        return numerics
    if numerics not in NUMERICS:
        raise ValueError(f"numerics={numerics!r}; allowed: {', '.join(NUMERICS)} or a Numerics instance")
    return NUMERICS[numerics]


COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the computations the reference runs in fp32.

    bf16/fp16 models: fp32, as in the reference precision map. float32 and float64 models: float64.
    For a float32 model this makes every result independent of batch composition and chunking: fp32
    GEMMs and reductions sum in an order that depends on the batch shape, and the resulting last-bit
    differences flip FP8/FP4 rounding decisions; float64 sums rounded once to fp32 do not."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else torch.float64


def _blockwise(fn, x: torch.Tensor, block: int) -> torch.Tensor:
    """Apply a per-block quantiser along the last dim; a partial last block (tiny test configs only)
    is zero-padded, which leaves its amax and hence its scale unchanged."""
    k = x.shape[-1]
    pad = (-k) % block
    if pad == 0:
        return fn(x, block)
    padded = torch.nn.functional.pad(x, (0, pad))
    return fn(padded, block)[..., :k]


def quantize_activation(x: torch.Tensor) -> torch.Tensor:
    """FP8 activation quantisation of a GEMM input: per row, blocks of 128 (checkpoint_format §7)."""
    from dsv4.quant.fp8 import fake_quant_fp8
    return _blockwise(fake_quant_fp8, x, 128)


def simulate_kv_fp8(kv: torch.Tensor, nope_dim: int) -> torch.Tensor:
    """FP8-simulate the nope dims of KV vectors in blocks of 64 (spec §2.6.1)."""
    from dsv4.quant.fp8 import fake_quant_fp8
    nope = _blockwise(fake_quant_fp8, kv[..., :nope_dim], 64)
    return torch.cat((nope, kv[..., nope_dim:]), dim=-1)


@functools.lru_cache(maxsize=8)
def _hadamard64(n: int) -> torch.Tensor:
    if n < 1 or n & (n - 1):
        raise ValueError(f"index_head_dim={n}: the indexer Hadamard rotation needs a power of two")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:  # Sylvester construction: H_2n = [[H, H], [H, -H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / n ** 0.5


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """Normalised Sylvester-Hadamard matrix, H[i, j] = (-1)^popcount(i & j) / sqrt(n); cached per
    device, so a forward never copies it from the host (and can run under CUDA-graph capture)."""
    return _hadamard_on(n, dtype, torch.device(device))


@functools.lru_cache(maxsize=None)
def _hadamard_on(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return _hadamard64(n).to(device=device, dtype=dtype)


def simulate_indexer_fp4(x: torch.Tensor) -> torch.Tensor:
    """Hadamard-rotate the last dim, then FP4-simulate it in blocks of 32 (spec §2.6.2)."""
    from dsv4.quant.mxfp4 import fake_quant_fp4
    acc = acc_dtype(x.dtype)
    rotated = (x.to(acc) @ hadamard_matrix(x.shape[-1], acc, x.device)).to(x.dtype)
    return _blockwise(fake_quant_fp4, rotated, 32)
