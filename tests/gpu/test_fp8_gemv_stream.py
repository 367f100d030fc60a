"""The few-row FP8 linear as a persistent Gluon kernel (`dsv4.kernels.fp8_gemv_stream`, prepared, opt-in) against
the torch reference and the model's FP8 linear, on fresh random inputs whose 128-blocks differ in magnitude (so
every activation and weight scale matters), poisoned outputs (an unwritten element shows as NaN). Hopper only."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_fp8_gemv import _weight, _x

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the Gluon FP8 GEMV needs a Hopper GPU (TMA, wgmma)", allow_module_level=True)

DEV = "cuda"


# Flash's decode linears (wq_a, wkv, wq_b, wo_b) and an odd one (9 K blocks, 10 64-row tiles)
@pytest.mark.parametrize("n,k", [(1024, 4096), (512, 4096), (32768, 1024), (4096, 8192), (640, 1152)])
@pytest.mark.parametrize("scale_dtype", ["e8m0", "float32"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_stream_gemv_is_the_fp8_linear(m, n, k, scale_dtype, poison, close_bf16):
    from dsv4.kernels.fp8_gemv_stream import fp8_gemv_stream
    from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref

    gen = torch.Generator(DEV).manual_seed(n + 3 * k + 17 * m)
    x = _x((m, k), gen)
    w, s = _weight(n, k, gen, scale_dtype)
    ref = fp8_linear_ref(x, w, s)
    for stages, split in ((None, None), (2, k // 128)):  # the default ring and split, then a short ring at 1 block
        poison()
        y = fp8_gemv_stream(x, w, s, stages=stages, split=split)
        close_bf16(y, ref, what=f"stream gemv {m}x{n}x{k} {scale_dtype} stages={stages} split={split}")
    close_bf16(y, fp8_linear(x, w, s), what="vs the model's FP8 linear")


def test_stream_gemv_refuses_what_it_cannot_tile():
    from dsv4.kernels.fp8_gemv_stream import fp8_gemv_stream

    gen = torch.Generator(DEV).manual_seed(5)
    w, s = _weight(256, 1024, gen, "e8m0")
    with pytest.raises(ValueError, match="x must be bf16"):
        fp8_gemv_stream(_x((9, 1024), gen), w, s)
    with pytest.raises(ValueError, match="split 3 must divide"):
        fp8_gemv_stream(_x((1, 1024), gen), w, s, split=3)
