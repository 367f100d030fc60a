"""GPU memory the decode steps' CUDA graphs hold, now that graphs are the default on one GPU (session 59): each
(row bucket, context bucket) graph is captured on first use into a private memory pool that lives as long as the
graph. N Flash-shaped layers with random weights (no disk), FP8 cache, the engine's defaults; for every row bucket
1..B a batch of that many requests decodes a few steps (prompts of `--prompt` tokens: one context bucket), then
`torch.cuda.memory_snapshot()` is summed per pool. The pools hold a step's transient buffers, so they grow with the
rows, not with the layers (compare `--layers 4` and `--layers 8`).

    python bench/bench_graph_memory.py [--layers 8] [--max-batch 64] [--prompt 256]
    python bench/bench_graph_memory.py --smoke      # the embedded model's shapes on the CPU: checks the script
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def pool_bytes() -> dict[tuple, int]:
    """Reserved bytes per private (graph) memory pool; the default pool, (0, 0), left out."""
    out: dict[tuple, int] = collections.Counter()
    for seg in torch.cuda.memory_snapshot():
        pool = tuple(seg.get("segment_pool_id", (0, 0)))
        if pool != (0, 0):
            out[pool] += seg["total_size"]
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    from bench_engine_step import _model
    from dsv4.engine.cache import CacheConfig
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.sampling_params import SamplingParams
    from dsv4.model.graphs import BUCKETS
    model, cfg = _model(types.SimpleNamespace(layers=args.layers, batches=str(args.max_batch), smoke=args.smoke,
                                              speculative=0))
    cuda = not args.smoke
    longest = args.prompt + 16
    pools = CacheConfig.for_capacity(cfg, max_num_seqs=args.max_batch, max_model_len=longest,
                                     total_tokens=args.max_batch * longest, kv_dtype="fp8" if cuda else "auto")
    engine = LLMEngine(model, cfg, None, EngineConfig(max_num_seqs=args.max_batch, max_model_len=longest,
                                                      cache=pools))
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{name}, {len(cfg.layers)} layers, prompts of {args.prompt} tokens; graph pools after each row bucket")
    print("rows | graphs | pool MiB (all) | this bucket's pool MiB")
    before: dict = {}
    for b in [s for s in BUCKETS if s <= args.max_batch]:
        for i in range(b):
            engine.add_request(f"b{b}-{i}", torch.randint(2, cfg.vocab_size, (args.prompt,), generator=g).tolist(),
                               params)
        while engine.has_unfinished():
            engine.step()
        now = pool_bytes() if cuda else {}
        new = sum(v for k, v in now.items() if k not in before)
        print(f"{b} | {len(now)} | {sum(now.values()) / 2**20:.1f} | {new / 2**20:.1f}")
        before = now
    if cuda:
        print(f"reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB in all, allocated "
              f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
