"""What one cache copy costs (`PagedPools.copy_pages`: a fork, a prefix snapshot, a retained prompt-end copy) at
Flash's shapes: the host's time per call, the GPU's (CUDA events around calls queued behind a long matmul), the
number of pool tensors it walks, and, as the ceiling of the same run, a device copy of the same bytes in one launch;
the Triton copy (`dsv4/kernels/page_copy.py`, what the engine runs on a GPU) beside its torch reference.

What a fork copies: the window ring's pages, the compressor state's page, and the last (partly filled) page of
each entry kind; the full entry pages are shared, not copied.

    python bench/bench_copy_pages.py [--layers 43] [--reps 20] [--kv-dtype fp8]
    python bench/bench_copy_pages.py --smoke      # a tiny config on the CPU: checks the script itself
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

sys.path.insert(0, os.path.dirname(__file__))
from bench_structured import queued_gpu_us, timed  # noqa: E402
from dsv4.engine.block_manager import PageHolder  # noqa: E402
from dsv4.engine.cache import CacheConfig, HybridCache  # noqa: E402
from dsv4.kernels.page_copy import copy_pages_ref  # noqa: E402


def _config(args):
    if args.smoke:
        from dsv4.checkpoint.writer import tiny_config
        return tiny_config("fp4", "sliding,csa,hca,csa", vocab_size=2048, sliding_window=128, index_topk=16)
    from bench_parallel import _config as flash
    return flash(os.path.join(os.path.dirname(__file__), "configs", "deepseek-v4-flash.config.json"), args.layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--context", type=int, default=4096, help="tokens the source holds")
    ap.add_argument("--kv-dtype", choices=["auto", "fp8"], default="fp8")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (host time only)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    cfg = _config(args)
    dev = torch.device("cpu" if args.smoke else args.device)
    cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=4, max_model_len=args.context,
                                                      kv_dtype=args.kv_dtype), dtype=torch.bfloat16, device=dev)
    bm, pools = cache.block_manager, cache.pools
    src = PageHolder("src")
    bm.allocate(src, args.context)
    dst = PageHolder("dst")
    bm.allocate(dst, args.context)
    # what a fork copies: the whole window ring and state, the last page of every entry kind
    copied = {kind: pages if kind in ("window", "state") else pages[-1:] for kind, pages in dst.block_tables.items()}
    source = {kind: src.block_tables[kind][: len(pages)] if kind in ("window", "state") else src.block_tables[kind][-1:]
              for kind, pages in copied.items()}
    tensors = [t for pool in pools.window.values() for t in pool.tensors()] + \
        [t for pool in pools.entries.values() for t in pool.tensors()] + list(pools.rows.values())
    page_bytes = 0
    for kind, pages in copied.items():
        pool_tensors = (list(pools.rows.values()) if kind == "state" else
                        [t for pool in pools.window.values() for t in pool.tensors()] if kind == "window" else
                        [t for (layer, name), pool in pools.entries.items() for t in pool.tensors()
                         if (f"compressed{cfg.layer(layer).compress_ratio}" if name == "main" else "indexer4") == kind])
        for t in pool_tensors:
            dim = 1 if kind == "state" else 0
            page_bytes += len(pages) * t.numel() // t.shape[dim] * t.element_size()

    def call() -> None:
        pools.copy_pages(source, copied)

    def torch_call() -> None:  # the torch reference of the same copy: an index_select + index_copy_ per view
        copy_pages_ref(*pools.page_lists(source, copied))

    lines = []
    if dev.type == "cuda":  # a long matmul to queue the calls behind, and one copy of as many bytes
        big = torch.randn(16384, 16384, device=dev, dtype=torch.bfloat16)
        flat = torch.empty(page_bytes, dtype=torch.uint8, device=dev)
        out = torch.empty_like(flat)
    for name, fn in (("copy_pages", call), ("torch reference", torch_call)):
        fn()
        line = f"| {name} | {cfg.num_layers} | {len(tensors)} | {page_bytes / 2**20:.1f} | " \
               f"{1e6 * timed(fn, args.reps):.0f} |"
        if dev.type == "cuda":
            line += f" {queued_gpu_us(fn, args.reps, big):.0f} | " \
                    f"{queued_gpu_us(lambda: out.copy_(flat), args.reps, big):.1f} |"
        else:
            line += " - | - |"
        lines.append(line)
    print(f"device: {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}; kv_dtype {args.kv_dtype}; "
          f"source {args.context} tokens")
    print("| path | layers | pool tensors | bytes copied (MiB) | host per copy (µs) | GPU per copy (µs) | "
          "one copy of as many bytes (µs) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
