"""Benchmark the FP8 block linear and routed-MoE kernels on one GPU (issue #5).

One script, one device call: measures the ceilings (copy bandwidth; bf16, FP8 tensorwise and FP8
blockwise torch._scaled_mm peaks), then every Flash/Pro linear shape and the MoE at
M in {1, 8, 64, 256, 1024, 4096} tokens, side by side with cuBLAS blockwise `_scaled_mm` (linears)
and bf16 experts + `torch._grouped_mm` (MoE). Each case is captured in a CUDA graph and timed with
`triton.testing.do_bench` (median, L2 flushed before every replay).

    python bench/bench_gemm_moe.py [--quick] [--out DIR] [--only linear|moe]

Writes bench.json and bench.md (a markdown section for docs/benchmarks.md) under --out and prints a
short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from dsv4.kernels.fp8_linear import (  # noqa: E402
    LinearConfig,
    act_quant,
    fp8_gemm,
    fp8_linear,
    grouped_fp8_linear,
    grouped_linear_bf16,
    pick_linear_config,
)
from dsv4.kernels.grouped_w8a16 import GroupedConfig, grouped_linear_w8a16, pick_grouped_config  # noqa: E402
from dsv4.kernels.moe import MoEConfig, PackedExperts, fused_moe, pick_moe_config  # noqa: E402

MS = [1, 8, 64, 256, 1024, 4096]
LINEARS = {
    "flash": [("wq_a", 1024, 4096), ("wkv", 512, 4096), ("wq_b", 32768, 1024), ("wo_b", 4096, 8192),
              ("sh_w13/e_proj", 4096, 4096), ("sh_w2", 4096, 2048), ("idx_wq_b", 8192, 1024)],
    "pro": [("wq_a", 1536, 7168), ("wkv", 512, 7168), ("wq_b", 65536, 1536), ("wo_b", 7168, 16384),
            ("sh_w13", 6144, 7168), ("sh_w2", 7168, 3072), ("idx_wq_b", 8192, 1536), ("e_proj", 7168, 7168)],
}
GROUPED = {"flash": (8, 1024, 4096), "pro": (16, 1024, 4096)}  # wo_a: G, Ro, K
MOE = {"flash": (256, 4096, 2048, 6), "pro": (384, 7168, 3072, 6)}  # E, D, I, top_k
DEV = "cuda"


def timed(fn, graph: bool = True) -> tuple[float, str]:
    """Median µs of fn; replayed from a CUDA graph when capture works (launch gaps removed)."""
    fn()
    torch.cuda.synchronize()
    run, how = fn, "eager"
    if graph:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run, how = g.replay, "graph"
        except Exception:  # noqa: BLE001 - some peers sync on the host; time them eagerly
            torch.cuda.synchronize()
    ms = do_bench(run, warmup=5, rep=30, return_mode="median")
    return ms * 1e3, how


def try_time(fn, graph: bool = True):
    try:
        return timed(fn, graph)
    except Exception as e:  # noqa: BLE001 - report the failure in the table, keep going
        print(f"  FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return float("nan"), "fail"


# --------------------------------------------------------------------------- ceilings


def ceilings() -> dict:
    out = {}
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    b = torch.empty_like(a)
    t, _ = timed(lambda: b.copy_(a), graph=False)
    out["copy_TBps"] = 2 * n / t / 1e6
    del a, b
    m = 8192
    x = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    t, _ = timed(lambda: x @ y, graph=False)
    out["bf16_TFLOPs"] = 2 * m**3 / t / 1e6
    x8, y8 = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV)
    t, _ = timed(lambda: torch._scaled_mm(x8, y8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), graph=False)
    out["fp8_tensorwise_TFLOPs"] = 2 * m**3 / t / 1e6
    sa = torch.ones(m, m // 128, device=DEV).t().contiguous().t()
    sb = torch.ones(m // 128, m // 128, device=DEV)
    t, _ = timed(lambda: torch._scaled_mm(x8, y8.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16), graph=False)
    out["fp8_blockwise_TFLOPs"] = 2 * m**3 / t / 1e6
    return out


# --------------------------------------------------------------------------- linears


def linear_alternatives(m: int) -> list[LinearConfig]:
    """Other launch shapes timed next to the default (`pick_linear_config`) in each regime."""
    if m <= 64:
        bm = max(16, triton.next_power_of_2(m))
        small = m <= 16
        return [LinearConfig(bm=bm, bn=128, swap_ab=True, fuse_quant=small, split_k=0),
                LinearConfig(bm=bm, bn=64, swap_ab=True, fuse_quant=not small, split_k=0),
                LinearConfig(bm=64, bn=128, swap_ab=False, fuse_quant=False, split_k=0)]
    return [LinearConfig(bm=64, bn=128, swap_ab=False, fuse_quant=False, num_warps=4),
            LinearConfig(bm=128, bn=128, swap_ab=False, fuse_quant=False, num_warps=8, num_stages=4),
            LinearConfig(bm=128, bn=64, swap_ab=False, fuse_quant=False, num_warps=4, num_stages=3)]


def bench_linears(models, ms, ceil, sweep: bool) -> list[dict]:
    rows = []
    for model in models:
        for name, n, k in LINEARS[model]:
            w = (torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
            ws = torch.randint(118, 125, (n // 128, k // 128), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
            ws32 = torch.exp2(ws.view(torch.uint8).float() - 127)
            for m in ms:
                x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
                q, sa = act_quant(x)
                r = dict(model=model, name=name, m=m, n=n, k=k)
                r["ours_us"], _ = try_time(lambda: fp8_linear(x, w, ws))
                r["ours_gemm_us"], _ = try_time(lambda: fp8_gemm(q, sa, w, ws))
                r["quant_us"], _ = try_time(lambda: act_quant(x))
                r["cublas_rows"] = m
                for nrow in (m, 16):  # cuBLAS blockwise rejects M = 1: measure it on 16 rows instead
                    xc = x if nrow == m else torch.randn(nrow, k, device=DEV).to(torch.bfloat16)
                    qc, sc = act_quant(xc)
                    sc_cm = sc.t().contiguous().t()  # cuBLAS wants the 1x128 scales outer-dim-major
                    r["cublas_gemm_us"], _ = try_time(lambda: torch._scaled_mm(
                        qc, w.t(), scale_a=sc_cm, scale_b=ws32.t(), out_dtype=torch.bfloat16))

                    def cublas_full():
                        qq, ss = act_quant(xc)
                        return torch._scaled_mm(qq, w.t(), scale_a=ss.t().contiguous().t(), scale_b=ws32.t(),
                                                out_dtype=torch.bfloat16)

                    r["cublas_us"], _ = try_time(cublas_full)
                    if r["cublas_us"] == r["cublas_us"]:  # not NaN
                        r["cublas_rows"] = nrow
                        break
                r["config"] = str(pick_linear_config(m, n, k))
                best, best_cfg = r["ours_us"], "default"
                if sweep:
                    for i, cfg in enumerate(linear_alternatives(m)):
                        t, _ = try_time(lambda: fp8_linear(x, w, ws, cfg))
                        r[f"alt{i}_us"] = t
                        if t < best:
                            best, best_cfg = t, str(cfg)
                r["best_us"], r["best_config"] = best, best_cfg
                _derive_linear(r, ceil)
                rows.append(r)
                print(f"{model:5s} {name:14s} M={m:5d} ours {r['ours_us']:8.1f} gemm {r['ours_gemm_us']:8.1f} "
                      f"cublas {r['cublas_us']:8.1f} (gemm {r['cublas_gemm_us']:8.1f}) best {best:8.1f} "
                      f"{r['tflops']:6.0f} TF/s {r['gbps']:6.0f} GB/s", flush=True)
            del w, ws, ws32
        rows += bench_grouped(model, ms, ceil)
    return rows


def _derive_linear(r: dict, ceil: dict) -> None:
    m, n, k, g = r["m"], r["n"], r["k"], r.get("groups", 1)
    t = r["ours_us"]
    flops = 2 * m * n * k * g
    nbytes = g * (n * k + (n // 128) * (k // 128)) + m * g * k * 2 + m * g * n * 2
    r["tflops"] = flops / t / 1e6
    r["gbps"] = nbytes / t / 1e3
    r["pct_bw"] = 100 * r["gbps"] / (ceil["copy_TBps"] * 1e3)
    r["pct_fp8"] = 100 * r["tflops"] / ceil["fp8_blockwise_TFLOPs"]
    if "cublas_us" in r:
        r["x_cublas"] = r["cublas_us"] / t
        r["x_cublas_gemm"] = r["cublas_gemm_us"] / r["ours_gemm_us"]


def bench_grouped(model, ms, ceil) -> list[dict]:
    g, ro, k = GROUPED[model]
    w = (torch.randn(g * ro, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    ws = torch.randint(118, 125, (g * ro // 128, k // 128), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    wb = (w.float() * torch.exp2(ws.view(torch.uint8).float() - 127).repeat_interleave(128, 0).repeat_interleave(
        128, 1)).to(torch.bfloat16)
    rows = []
    for m in ms:
        x = torch.randn(m, g, k, device=DEV).to(torch.bfloat16)
        r = dict(model=model, name="wo_a (grouped)", m=m, n=ro, k=k, groups=g)
        r["ours_us"], _ = try_time(lambda: grouped_fp8_linear(x, w, ws))
        r["bf16_bmm_us"], _ = try_time(lambda: grouped_linear_bf16(x, wb))
        r["w8a16_us"], _ = try_time(lambda: grouped_linear_w8a16(x, w, ws))  # kernel mode's decode path
        if m <= 64:  # launch shapes of the W8A16 kernel: the K split (0 = auto), and one deeper pipeline
            base = pick_grouped_config(m)
            for split, stages in ((1, 4), (2, 4), (4, 4), (8, 4), (0, 4), (0, 6)):
                cfg = GroupedConfig(**{**base.__dict__, "split_k": split, "num_stages": stages})
                key = f"w8a16_k{split or 'auto'}{'' if stages == base.num_stages else f'_s{stages}'}_us"
                r[key], _ = try_time(lambda: grouped_linear_w8a16(x, w, ws, config=cfg))
        _derive_linear(r, ceil)
        r["x_bf16"] = r["bf16_bmm_us"] / r["ours_us"]
        rows.append(r)
        shapes = " ".join(f"{k[6:-3]} {v:.1f}" for k, v in r.items() if k.startswith("w8a16_k"))
        print(f"{model:5s} wo_a grouped   M={m:5d} fp8 {r['ours_us']:8.1f} bf16 {r['bf16_bmm_us']:8.1f} "
              f"w8a16 {r['w8a16_us']:8.1f} ({shapes})", flush=True)
    return rows


# --------------------------------------------------------------------------- MoE


def random_experts(e: int, d: int, i: int, fmt: str) -> PackedExperts:
    """Random weights directly in kernel layout (any byte pattern is a valid repacked MXFP4 weight)."""
    if fmt == "mxfp4":
        def u8(*shape, lo=0, hi=256):
            return torch.randint(lo, hi, shape, device=DEV, dtype=torch.uint8)

        def scales(n, kk):  # int32 words of 4 E8M0 bytes, [E, N, K/128]
            return u8(e, n, kk // 128, 4, lo=118, hi=125).view(torch.int32).view(e, n, kk // 128)

        from dsv4.kernels.moe_layout import fp8_tiles

        s13, s2 = scales(2 * i, d), scales(d, i)
        tile_bmax, tiles_ok = fp8_tiles(s13.view(torch.uint8).view(e, 2 * i, d // 32))
        tile_bmax2, tiles_ok2 = fp8_tiles(s2.view(torch.uint8).view(e, d, i // 32))
        return PackedExperts("mxfp4", e, d, i, u8(e, 2 * i, d // 2), s13, u8(e, d, i // 2), s2, wide_ok=True,
                             w13_tile_bmax=tile_bmax, fp8_tiles_ok=tiles_ok, w2_tile_bmax=tile_bmax2,
                             fp8_w2_tiles_ok=tiles_ok2)
        # (scale bytes <= 128, within 6 of each other)
    w13 = torch.empty(e, 2 * i, d, device=DEV, dtype=torch.float8_e4m3fn)
    w2 = torch.empty(e, d, i, device=DEV, dtype=torch.float8_e4m3fn)
    for x in range(e):
        w13[x] = (torch.randn(2 * i, d, device=DEV) * 0.5).to(torch.float8_e4m3fn)
        w2[x] = (torch.randn(d, i, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    s13 = torch.exp2(torch.randint(-9, -5, (e, 2 * i // 128, d // 128), device=DEV).float())
    s2 = torch.exp2(torch.randint(-9, -5, (e, d // 128, i // 128), device=DEV).float())
    return PackedExperts("fp8", e, d, i, w13, s13, w2, s2)


def expert_bytes(ex: PackedExperts) -> int:
    return sum(t[0].numel() * t.element_size() for t in (ex.w13, ex.w13_scale, ex.w2, ex.w2_scale))


def moe_alternatives() -> dict:
    return {
        "decode": MoEConfig(bm=16, bn1=64, bn2=64, quant_first=False, quant_out=False, num_stages=4),
        "decode_bn128": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=4, num_stages=4),
        "bm32": MoEConfig(bm=32, bn1=64, bn2=128, quant_first=True, quant_out=False, num_stages=4),
        "prefill": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, warps2=8),
        "bm128_bn64": MoEConfig(bm=128, bn1=64, bn2=64, quant_first=True, quant_out=False, warps1=8, warps2=4),
        "prefill_w2_4warps": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8),
        "swap128": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, swap=True, num_stages=4),
        "swap128_s6": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, swap=True, num_stages=6),
        "swap128_w8": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, swap=True, warps1=8,
                                warps2=8, num_stages=4),
        "swap64": MoEConfig(bm=16, bn1=64, bn2=64, quant_first=True, quant_out=False, swap=True, num_stages=4),
        "swap64_s6": MoEConfig(bm=16, bn1=64, bn2=64, quant_first=True, quant_out=False, swap=True, num_stages=6),
        "swap_bm32": MoEConfig(bm=32, bn1=128, bn2=128, quant_first=True, quant_out=True, swap=True, num_stages=4),
        "swap_bm64": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, swap=True, num_stages=3),
        # session 5: CUDA-core W4A8 per pair (dsv4.kernels.moe_gemv)
        "gemv32_u4": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=32, gemv_unroll=4),
        "gemv32_u2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=32, gemv_unroll=2),
        "gemv32_u1": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=32, gemv_unroll=1),
        "gemv16_w2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=16, warps1=2,
                               gemv_unroll=2),
        "gemv64": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_unroll=2),
        # per pair, group sums as f16 tensor-core MMAs (moe_gemv method "mma"): rows, warps, K blocks per step
        # (gemv_unroll), per tl.dot (gemv_dot_blocks), pipeline depth (gemv_stages)
        "mma64_u2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                              gemv_unroll=2, gemv_stages=3),
        # split-K of the "mma" GLU (gemv_split) and down (gemv_split_down) kernels, reduced in the launch
        "mma64_u2_k2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                 gemv_unroll=2, gemv_stages=3, gemv_split=2),
        "mma64_u2_k4": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                 gemv_unroll=2, gemv_stages=3, gemv_split=4),
        # session 13 (Nsight Compute: the B = 1 GLU runs one wave of 384 programs, 3 per SM by shared memory,
        # 16 % of warps active): more, lighter programs -- 3 or 4 K ranges on 2 pipeline stages
        "mma64_u2_k3": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                 gemv_unroll=2, gemv_stages=3, gemv_split=3),
        "mma64_u2_k3_s2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64,
                                    gemv_mma=True, gemv_unroll=2, gemv_stages=2, gemv_split=3),
        "mma64_u2_k4_s2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64,
                                    gemv_mma=True, gemv_unroll=2, gemv_stages=2, gemv_split=4),
        "mma64_u2_k2_d2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64,
                                    gemv_mma=True, gemv_unroll=2, gemv_stages=3, gemv_split=2, gemv_split_down=2),
        "mma64_u2_s4": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                 gemv_unroll=2, gemv_stages=4),
        "mma64_u2_kd2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                  gemv_unroll=2, gemv_dot_blocks=2, gemv_stages=3),
        "mma64_u4_s2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                 gemv_unroll=4, gemv_stages=2),
        "mma64_u1_s4": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                                 gemv_unroll=1, gemv_stages=4),
        "mma128_w8_u2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=128, warps1=8,
                                  gemv_mma=True, gemv_unroll=2, gemv_stages=3),
        "mma128_w8_u4_s2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=128, warps1=8,
                                     gemv_mma=True, gemv_unroll=4, gemv_stages=2),
        "mma128_w4_u2": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=128, warps1=4,
                                  gemv_mma=True, gemv_unroll=2, gemv_stages=3),
        # session 8: W4A8 values on bf16 wgmma, one K chain (dsv4.kernels.moe_wide): token rows, warps, stages
        "wide64_w8": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, wide=True),
        "wide64_w8_s4": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, num_stages=4,
                                  wide=True),
        "wide64_w4": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=4, wide=True),
        "wide128_w8": MoEConfig(bm=128, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, wide=True),
        "wide128_w8_s2": MoEConfig(bm=128, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8,
                                   num_stages=2, wide=True),
        "wide32_w4": MoEConfig(bm=32, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=4, wide=True),
    }


def peer_moe(x, ids, w, w13b, w2b, limit=10.0):
    """bf16 experts + torch._grouped_mm (no host sync, so it can be graph-captured)."""
    m, k = ids.shape
    e, two_i, _ = w13b.shape
    flat = ids.reshape(-1)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(0, flat, torch.ones_like(flat,
                                                                                                     dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    order = torch.argsort(flat)
    xs = x[order // k]
    h = torch._grouped_mm(xs, w13b.transpose(1, 2), offs=offs)
    g, u = h.float().split(two_i // 2, dim=-1)
    z = (torch.nn.functional.silu(g.clamp(max=limit)) * u.clamp(-limit, limit) * w.reshape(-1)[order, None])
    y = torch._grouped_mm(z.to(torch.bfloat16), w2b.transpose(1, 2), offs=offs)
    out = torch.empty_like(y).index_copy_(0, order, y)
    return out.view(m, k, -1).float().sum(1).to(torch.bfloat16)


def bench_moe(models, ms, ceil, sweep: bool, base: bool) -> list[dict]:
    rows = []
    cases = [(mdl, "mxfp4") for mdl in models] + ([("flash", "fp8")] if base else [])
    for model, fmt in cases:
        e, d, i, k = MOE[model]
        ex = random_experts(e, d, i, fmt)
        per_expert = expert_bytes(ex)
        peer = None
        if fmt == "mxfp4":
            try:
                w13b = torch.randn(e, 2 * i, d, device=DEV, dtype=torch.bfloat16).mul_(0.02)
                w2b = torch.randn(e, d, i, device=DEV, dtype=torch.bfloat16).mul_(0.02)
                peer = (w13b, w2b)
                del w13b, w2b
            except torch.OutOfMemoryError:
                print("  peer weights do not fit", flush=True)
        for m in ms:
            x = torch.randn(m, d, device=DEV).to(torch.bfloat16)
            ids = torch.rand(m, e, device=DEV).topk(k, dim=1).indices
            w = torch.rand(m, k, device=DEV) + 0.1
            touched = int(torch.unique(ids).numel())
            label = model if fmt == "mxfp4" else "flash-base (fp8)"
            r = dict(model=label, m=m, touched=touched, e=e, d=d, i=i, k=k)
            r["ours_us"], _ = try_time(lambda: fused_moe(x, ids, w, ex))
            r["config"] = str(pick_moe_config(m * k, e, hidden=d))
            best, best_name = r["ours_us"], "default"
            if fmt == "mxfp4":
                r["ours_w4a16_us"], _ = try_time(lambda: fused_moe(x, ids, w, ex, act="bf16"))
            if sweep:
                for nm, cfg in moe_alternatives().items():
                    if cfg.gemv and m > 64:  # one program per pair: a decode-size path only
                        continue
                    if cfg.wide and (fmt != "mxfp4" or m < 64):  # MXFP4 at prefill sizes only
                        continue
                    t, _ = try_time(lambda: fused_moe(x, ids, w, ex, config=cfg))
                    r[f"{nm}_us"] = t
                    if t < best:
                        best, best_name = t, nm
            r["best_us"], r["best_config"] = best, best_name
            if peer is not None:
                r["peer_us"], r["peer_timing"] = try_time(lambda: peer_moe(x, ids, w, *peer))
            t = r["ours_us"]
            r["expert_GB"] = touched * per_expert / 1e9
            r["gbps"] = touched * per_expert / t / 1e3
            r["pct_bw"] = 100 * r["gbps"] / (ceil["copy_TBps"] * 1e3)
            r["tflops"] = 6 * m * k * d * i / t / 1e6
            r["pct_fp8"] = 100 * r["tflops"] / ceil["fp8_blockwise_TFLOPs"]
            r["bw_floor_us"] = touched * per_expert / (ceil["copy_TBps"] * 1e6)
            if "peer_us" in r:
                r["x_peer"] = r["peer_us"] / t
            rows.append(r)
            print(f"moe {label:16s} M={m:5d} touched {touched:3d} ours {t:8.1f} µs (floor {r['bw_floor_us']:6.1f}) "
                  f"w4a16 {r.get('ours_w4a16_us', float('nan')):8.1f} best {best:8.1f} ({best_name}) "
                  f"peer {r.get('peer_us', float('nan')):8.1f} {r['pct_bw']:5.1f}% BW {r['tflops']:6.0f} TF/s",
                  flush=True)
        del ex, peer
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- report


def markdown(meta: dict, ceil: dict, lin: list[dict], moe: list[dict]) -> str:
    out = [f"Date {meta['date']}, GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}.",
           f"Command: `{meta['command']}`. CUDA-graph replay timed with do_bench (median, L2 flushed).", "",
           f"Ceilings (same run): copy {ceil['copy_TBps']:.2f} TB/s; bf16 {ceil['bf16_TFLOPs']:.0f} TFLOP/s; "
           f"FP8 tensorwise {ceil['fp8_tensorwise_TFLOPs']:.0f}; FP8 blockwise {ceil['fp8_blockwise_TFLOPs']:.0f}.", ""]
    if lin:
        out += ["FP8 linear (ours = quant + GEMM, µs; cuBLAS = our act_quant + `_scaled_mm` blockwise; "
                "×cuBLAS > 1 means ours is faster; GEMM-only columns exclude the activation quantisation; "
                "* = cuBLAS measured on 16 rows because it rejects M = 1):", "",
                "| model | linear | N×K | M | ours µs | cuBLAS µs | ×cuBLAS | ours GEMM µs | cuBLAS GEMM µs | ×GEMM |"
                " TFLOP/s | GB/s | %BW | %FP8 |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in lin:
            if "groups" in r:
                continue
            star = "*" if r.get("cublas_rows", r["m"]) != r["m"] else ""
            out.append(f"| {r['model']} | {r['name']} | {r['n']}×{r['k']} | {r['m']} | {r['ours_us']:.1f} | "
                       f"{r['cublas_us']:.1f}{star} | {r['x_cublas']:.2f} | {r['ours_gemm_us']:.1f} | "
                       f"{r['cublas_gemm_us']:.1f} | {r['x_cublas_gemm']:.2f} | {r['tflops']:.0f} | {r['gbps']:.0f} | "
                       f"{r['pct_bw']:.0f} | {r['pct_fp8']:.0f} |")
        out += ["", "Grouped wo_a (x [M, G, 4096] · wo_a[g]^T): FP8 Triton option, the bf16 GEMMs "
                "(`grouped_linear_bf16`: cuBLAS per group; a batched `bmm` before session 12), and the W8A16 "
                "kernel (FP8 weight, bf16 input; kernel mode's decode path):", "",
                "| model | G | M | FP8 µs | bf16 µs | W8A16 µs | ×bf16 | TFLOP/s | %BW |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in lin:
            if "groups" in r:
                out.append(f"| {r['model']} | {r['groups']} | {r['m']} | {r['ours_us']:.1f} | {r['bf16_bmm_us']:.1f} | "
                           f"{r['w8a16_us']:.1f} | {r['x_bf16']:.2f} | {r['tflops']:.0f} | {r['pct_bw']:.0f} |")
    if moe:
        out += ["", "Routed MoE (ours = align + GEMM1 + GEMM2 + combine, W4A8 reference-exact; W4A16 option; peer = "
                "bf16 experts + `torch._grouped_mm`; %BW on the expert bytes touched; %FP8 of the blockwise peak):", "",
                "| experts | M | touched | ours µs | BW floor µs | %BW | TFLOP/s | %FP8 | W4A16 µs | best µs (cfg) | "
                "peer µs | ×peer |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in moe:
            out.append(f"| {r['model']} | {r['m']} | {r['touched']} | {r['ours_us']:.1f} | {r['bw_floor_us']:.1f} | "
                       f"{r['pct_bw']:.0f} | {r['tflops']:.0f} | {r['pct_fp8']:.0f} | "
                       f"{r.get('ours_w4a16_us', float('nan')):.1f} | {r['best_us']:.1f} ({r['best_config']}) | "
                       f"{r.get('peer_us', float('nan')):.1f} | {r.get('x_peer', float('nan')):.2f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="M in {1, 64, 4096}, no config sweep")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--only", choices=["linear", "grouped", "moe"], default=None,
                    help="linear: FP8 linears + grouped wo_a; grouped: only the grouped wo_a")
    ap.add_argument("--models", default="flash,pro")
    ap.add_argument("--ms", default=None, help="comma-separated token counts (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    ms = [1, 64, 4096] if args.quick else MS
    if args.ms:
        ms = [int(v) for v in args.ms.split(",")]
    sweep = not (args.quick or args.no_sweep)
    models = args.models.split(",")
    t0 = time.time()
    meta = dict(date=datetime.datetime.now().isoformat(timespec="minutes"), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, command="python " + " ".join(sys.argv))
    ceil = ceilings()
    print("ceilings", json.dumps({k: round(v, 2) for k, v in ceil.items()}), flush=True)
    lin, moe = [], []
    try:
        if args.only in (None, "linear"):
            lin = bench_linears(models, ms, ceil, sweep)
        if args.only == "grouped":
            lin = [r for model in models for r in bench_grouped(model, ms, ceil)]
        if args.only in (None, "moe"):
            moe = bench_moe(models, ms, ceil, sweep, base=True)
    except Exception:  # noqa: BLE001 - keep what was measured
        traceback.print_exc()
    md = markdown(meta, ceil, lin, moe)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(dict(meta=meta, ceilings=ceil, linear=lin, moe=moe), f, indent=1, default=str)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md)
    print(f"\n(total {time.time() - t0:.0f} s)\n")
    print(md)


if __name__ == "__main__":
    main()
