"""Structured outputs' token masks applied to logits as one Triton launch.

`apply_token_masks(logits [B, V] fp32 / bf16, words [B, W] int32) -> out [B, V]`: out[b, v] = logits[b, v] where
bit v % 32 of words[b, v // 32] is 1 (bit 31 is the sign bit), else -inf; columns past 32 W are -inf (ids past the
tokenizer's vocabulary). A row of -1 words keeps its logits. `apply_token_masks_ref` is the same in torch.

Why a kernel: torch unpacks the words into a [B, 32 W] int32 / bool pair of tensors and selects (≈ 8 launches); at
B = 64 and Flash's 129,280 tokens that took 1.36 ms of H100 time (`bench/bench_structured.py`, session 57) where a
copy of the logits takes 24 µs. The kernel reads the logits and the words once and writes the result once.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton

BLOCK = 4096  # columns per program


# --------------------------------------------------------------------------- torch reference

_BITS: dict[str, torch.Tensor] = {}


def _bit_values(dev: torch.device) -> torch.Tensor:
    """[32] int32: 1 << k (k = 31 is the sign bit), made once per device."""
    key = str(dev)
    if key not in _BITS:
        _BITS[key] = (torch.ones(32, dtype=torch.int32) << torch.arange(32, dtype=torch.int32)).to(dev)
    return _BITS[key]


def apply_token_masks_ref(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Torch `apply_token_masks`."""
    _check(logits, words)
    vocab = logits.shape[1]
    allowed = (words[:, :, None] & _bit_values(logits.device)).ne(0).flatten(1)[:, :vocab]
    if allowed.shape[1] < vocab:  # ids past the tokenizer's vocabulary are never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    return torch.where(allowed, logits, float("-inf"))


def _check(logits: torch.Tensor, words: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"apply_token_masks: logits must be fp32/bf16 [B, V], got {logits.dtype} "
                         f"{tuple(logits.shape)}")
    if words.dim() != 2 or words.dtype != torch.int32 or words.shape[0] != logits.shape[0]:
        raise ValueError(f"apply_token_masks: words must be int32 [{logits.shape[0]}, W], got {words.dtype} "
                         f"{tuple(words.shape)}")
    if words.device != logits.device:
        raise ValueError(f"apply_token_masks: words on {words.device}, logits on {logits.device}")


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:
    @triton.jit(do_not_specialize=["V", "W"])
    def _token_mask_kernel(X, WORDS, Y, V, W, stride_x, stride_w, stride_y, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < V
        # (selected in fp32, which holds every bf16 value exactly: the interpreter has no bf16 constants)
        x = tl.load(X + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
        idx = cols // 32
        word = tl.load(WORDS + row * stride_w + idx, mask=inside & (idx < W), other=0)
        keep = ((word >> (cols % 32)) & 1) != 0  # (an arithmetic shift: bit 31 still ends in bit 0)
        y = tl.where(keep, x, float("-inf"))
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=inside)


def apply_token_masks(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Triton `apply_token_masks_ref`: one launch, no host syncs."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.token_mask.apply_token_masks needs triton")
    _check(logits, words)
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    w = words if words.stride(-1) == 1 else words.contiguous()
    b, v = x.shape
    out = torch.empty_like(x)
    if b and v:
        _token_mask_kernel[(b, triton.cdiv(v, BLOCK))](x, w, out, v, w.shape[1], x.stride(0), w.stride(0),
                                                       out.stride(0), BLOCK=BLOCK, num_warps=8)
    return out
