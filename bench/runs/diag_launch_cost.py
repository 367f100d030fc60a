"""Session 60: the device host's cost per launch (µs of wall time, the GPU idle): an empty Triton kernel through
`kernel[grid](...)` (with and without PDL's launch attribute), torch.empty, a torch add, and `torch._scaled_mm`
blockwise at a 128-row prefill shape. Tells whether a short prompt's eager prefill is bound by launches."""
import time

import torch
import triton
import triton.language as tl

from dsv4.kernels._triton import pdl_kernel, pdl_wait


@triton.jit
def _touch(X, n, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(X + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


@pdl_kernel
@triton.jit
def _touch_pdl(X, n, B: tl.constexpr):
    pdl_wait()
    offs = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(X + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


x = torch.randn(4096, device="cuda")
a = torch.randn(128, 4096, device="cuda")
q = a.to(torch.float8_e4m3fn)
w = torch.randn(4096, 4096, device="cuda").to(torch.float8_e4m3fn)
sa = torch.rand(4096 // 128, 128, device="cuda").t()
sw = torch.rand(32, 32, device="cuda").t()
rows = [("triton kernel[grid](x, n, B=1024)", lambda: _touch[(4,)](x, 4096, B=1024)),
        ("same, PDL launch", lambda: _touch_pdl[(4,)](x, 4096, B=1024)),
        ("torch.empty", lambda: torch.empty(128, 4096, device="cuda")),
        ("torch add", lambda: x.add(1.0)),
        ("torch._scaled_mm blockwise 128x4096x4096",
         lambda: torch._scaled_mm(q, w.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16))]
for name, fn in rows:
    print(f"{per_call_us(fn):8.1f} us  {name}")
