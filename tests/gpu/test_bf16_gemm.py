"""`bf16_gemm_fp32` (dsv4.model.linear): the CUDA bf16 GEMM into fp32 of the LM head (and, next, of
the plain linears and the MoE router) equals the fp32 GEMM of the same bf16 values (products are
exact in fp32; only the summation order differs), for decode- and prefill-sized inputs, 2-D and 3-D."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


@pytest.mark.skipif(DEV != "cuda", reason="the bf16 -> fp32 GEMM is a CUDA path")
@pytest.mark.parametrize("shape,n", [((1, 4096), 1024), ((37, 4096), 256), ((2, 5, 1024), 4096), ((2048, 4096), 64)])
def test_bf16_gemm_fp32_equals_fp32_gemm(shape, n):
    from dsv4.model.linear import bf16_gemm_fp32

    g = torch.Generator(device=DEV).manual_seed(n)
    x = torch.randn(shape, generator=g, device=DEV).to(torch.bfloat16)
    w = (torch.randn(n, shape[-1], generator=g, device=DEV) * 0.02).to(torch.bfloat16)
    got = bf16_gemm_fp32(x, w)
    assert got is not None and got.dtype == torch.float32 and got.shape == (*shape[:-1], n)
    want = torch.nn.functional.linear(x.double(), w.double())
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err < 1e-5, err  # fp32 accumulation over K <= 4096
    assert bf16_gemm_fp32(x.float(), w) is None  # other dtypes: the caller's fp32 path
