"""FP8 e4m3fn: block-quantised weights, dynamic activation quantisation and the FP8 simulation.

All rules are checkpoint_format.md §5/§7/§8 and deepseek_v4_model.md §2.6: power-of-two scales
`pow2_ceil(amax * fp32(1/448))`, values clamped to ±448, then rounded to nearest-even e4m3.
Rounding of fp32 (and bf16/fp16, widened exactly) uses torch's float32 -> float8_e4m3fn cast,
which the tests check is RNE against an independent float64 derivation. float64 inputs stay float64
and are rounded on the e4m3 grid directly, because torch's float64 -> fp8 cast passes through fp32
and could round twice. Dividing by a power-of-two scale is exact in both.
"""

from __future__ import annotations

import torch

from dsv4.quant.e8m0 import e8m0_to_float, float_to_e8m0, pow2_ceil

E4M3_MAX = 448.0
# fp32(1/448): multiplied, not divided; on the CPU even when first imported under `with torch.device(...)`
INV_E4M3_MAX = torch.tensor(1.0 / 448.0, dtype=torch.float32, device="cpu")
# Floor of amax for activations (from the reference) and, by our choice, for weights too: it keeps
# scales >= 2^-22, so every dequantised value stays exactly representable in bf16 (smallest
# product 2^-9 * 2^-22), and an all-zero tile still gets a finite E8M0 scale.
AMAX_FLOOR = 1e-4


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _e4m3_round(scaled: torch.Tensor) -> torch.Tensor:
    """Clamp to ±448 and round to the nearest-even e4m3 value, in scaled's dtype (NaN stays NaN)."""
    x = scaled.clamp(-E4M3_MAX, E4M3_MAX)
    if x.dtype == torch.float32:
        return x.to(torch.float8_e4m3fn).to(torch.float32)
    # float64: grid spacing is 2^(floor(log2|x|) - 3), subnormal spacing 2^-9; round() is half-even.
    exponent = (torch.frexp(x).exponent - 1).clamp_min(-6)
    quantum = torch.ldexp(torch.ones_like(x), (exponent - 3).to(x.dtype))
    return torch.round(x / quantum) * quantum


def _block_scales(amax: torch.Tensor) -> torch.Tensor:
    """fp32 power-of-two scales: fp32 amax (floored) times fp32(1/448), rounded up by pow2_ceil."""
    return pow2_ceil(amax.to(torch.float32).clamp_min(AMAX_FLOOR) * INV_E4M3_MAX)


def _check_2d(w: torch.Tensor, name: str) -> None:
    if w.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D [out, in] weight, got shape {tuple(w.shape)}")


def _pad_to_blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    n, k = w.shape
    pad_n, pad_k = (-n) % block, (-k) % block
    if pad_n or pad_k:
        w = torch.nn.functional.pad(w, (0, pad_k, 0, pad_n))
    return w


def _expand_tiles(scale: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    """[ceil(n/block), ceil(k/block)] tile scales -> one scale per element [n, k]."""
    return scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]


def quantize_fp8_block(
    w: torch.Tensor, scale_dtype: str = "e8m0", block: int = 128, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a [N, K] weight to e4m3fn with one power-of-two scale per block x block tile.

    Partial edge tiles are allowed (scale grid is ceil(N/block) x ceil(K/block)). The scale is
    returned as float8_e8m0fnu (`scale_dtype="e8m0"`, Flash/Pro) or float32 (`"float32"`,
    Flash-Base). Tile amax is floored at AMAX_FLOOR.
    """
    _check_2d(w, name)
    if scale_dtype not in ("e8m0", "float32"):
        raise ValueError(f"{name}: scale_dtype must be 'e8m0' or 'float32', got {scale_dtype!r}")
    if not w.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point weight, got {w.dtype}")
    x = w.detach().to(_work_dtype(w))
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: weight contains NaN or inf; cannot quantise to FP8")
    n, k = x.shape
    padded = _pad_to_blocks(x, block)
    nb, kb = padded.shape[0] // block, padded.shape[1] // block
    amax = padded.abs().view(nb, block, kb, block).amax(dim=(1, 3))
    scale = _block_scales(amax)
    wq = _e4m3_round(x / _expand_tiles(scale, n, k, block)).to(torch.float8_e4m3fn)
    if scale_dtype == "e8m0":
        return wq, float_to_e8m0(scale, name=f"{name} scale")
    return wq, scale


def dequantize_fp8_block(
    wq: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    block: int = 128,
    name: str = "weight",
) -> torch.Tensor:
    """`W[n, k] = e4m3(wq[n, k]) * scale[n // block, k // block]`, exact in fp32 and bf16.

    `scale` may be float8_e8m0fnu, raw uint8 E8M0 bytes, or a float tensor holding the values.
    Only E8M0 bytes >= 247 can push a value past the fp32 range (giving ±inf).
    """
    _check_2d(wq, name)
    if wq.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name}: expected float8_e4m3fn weight, got {wq.dtype}")
    n, k = wq.shape
    expected = (-(-n // block), -(-k // block))
    if tuple(scale.shape) != expected:
        raise ValueError(
            f"{name}: scale shape {tuple(scale.shape)} does not match weight {(n, k)} "
            f"with {block}x{block} tiles (expected {expected})"
        )
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        s = e8m0_to_float(scale, name=f"{name} scale")
    elif scale.is_floating_point() and scale.dtype != torch.float8_e4m3fn:
        s = scale.to(torch.float32)
    else:
        raise ValueError(f"{name}: unsupported scale dtype {scale.dtype}")
    w = wq.to(torch.float32) * _expand_tiles(s, n, k, block)
    return w.to(dtype)


def _row_blocks(x: torch.Tensor, block: int, what: str) -> torch.Tensor:
    if x.dim() == 0 or x.shape[-1] % block != 0:
        raise ValueError(
            f"{what}: last dim of shape {tuple(x.shape)} must be a multiple of block={block}"
        )
    return x.to(_work_dtype(x)).reshape(*x.shape[:-1], x.shape[-1] // block, block)


def quantize_act(x: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 quantisation per row and per `block` consecutive channels of the last dim.

    Returns `q` (float8_e4m3fn, shape of x) and `s` (float32 powers of two, [..., K/block]) with
    `x ≈ q * s`. amax is floored at 1e-4. NaN in a block propagates to its scale and values.
    """
    xb = _row_blocks(x, block, "quantize_act")
    s = _block_scales(xb.abs().amax(dim=-1))
    q = _e4m3_round(xb / s.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), s


def fake_quant_fp8(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP8 simulation: quantise as `quantize_act(x, block)` and dequantise back to x's dtype."""
    xb = _row_blocks(x, block, "fake_quant_fp8")
    s = _block_scales(xb.abs().amax(dim=-1)).unsqueeze(-1)
    return (_e4m3_round(xb / s) * s).reshape(x.shape).to(x.dtype)
