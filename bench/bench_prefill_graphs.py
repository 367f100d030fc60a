"""Short prompts' prefill as piecewise CUDA graphs (dsv4.model.prefill_graphs) against the eager forward, in one
run: N Flash-shaped layers with random weights made on the GPU (no disk), the paged FP8 cache, one fresh prompt of
P tokens per forward (released after it). Per P: the wall time of one forward, synchronised before and after
(median over the reps, the two modes alternating), eager and as prefill pieces, and their ratio. The copy
bandwidth and bf16 matmul peak of the same run come first, then the capture of every bucket ahead (its time and
memory).

    python bench/bench_prefill_graphs.py [--layers 8] [--prompts 16,64,128,200,256] [--reps 7] [--mtp]

`--mtp`: each forward is followed by the MTP block over the same rows (the speculator's catch-up), eagerly or as
its own pieces alike. `--decode-rows B [--ctx C]`: each forward also brings one decode row of each of B sequences at
C tokens of context (a prompt arriving while B requests decode); the two modes are then one forward (the pieces on)
against `mixed_steps.SPLIT_MIXED_STEPS` (the decode rows as their own graphed step, the prompt as pieces); with
`--one-pass` they are that split against `mixed_steps.ONE_PASS_MIXED_STEPS` (one forward, the decode rows' attention
as their fixed-shape step inside the prompt's pieces).

`--smoke`: a tiny config with random weights on the CPU (torch kernels, the pieces run uncaptured), to check the
script itself (tests/test_bench_parallel_smoke.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _forward_ms(run, tokens: int, mtp: bool, decoding: list) -> float:
    """One forward: a fresh prompt of `tokens` tokens, after one decode row of each of the `decoding` states."""
    state = run.new_states(1)
    states, lens = decoding + state, [1] * len(decoding) + [tokens]
    _sync()
    t = time.perf_counter()
    run.forward(states, lens)
    if mtp:  # the speculator's catch-up over the same rows
        run.mtp(states, lens)
    _sync()
    ms = (time.perf_counter() - t) * 1e3
    run.release(state)
    return ms


def _capture_report(model, dev: torch.device, mtp: bool) -> None:
    """Every bucket captured ahead (as `dsv4 serve` does at startup): how long it took, the static buffers' bytes and
    the GPU memory it reserved (static buffers + the graphs' pool)."""
    if dev.type == "cuda":  # (a capture empties the allocator's cache: the same before the baseline)
        torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved() if dev.type == "cuda" else 0
    _sync()
    t = time.perf_counter()
    sizes = model._graphs.capture_prefill(mtp=mtp)
    _sync()
    s = time.perf_counter() - t
    grown = (torch.cuda.memory_reserved() - reserved) if dev.type == "cuda" else 0
    arena = model._graphs.prefill_arena
    print(f"capture of buckets {sizes}: {s:.1f} s, static buffers {arena.nbytes() / 2**20 if arena else 0:.0f} MiB, "
          f"GPU memory reserved +{grown / 2**20:.0f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompts", default="16,64,128,200,256")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--mtp", action="store_true", help="each forward followed by the MTP block over its rows")
    p.add_argument("--decode-rows", type=int, default=0,
                   help="B: each forward also brings one decode row of B sequences at --ctx tokens; the modes are "
                        "then one forward against mixed_steps' split (decode rows as their own graphed step)")
    p.add_argument("--ctx", type=int, default=1024, help="the decode rows' context (with --decode-rows)")
    p.add_argument("--one-pass", action="store_true", help="with --decode-rows: the split against the one pass")
    p.add_argument("--smoke", action="store_true", help="tiny config on the CPU (checks the script)")
    args = p.parse_args()
    from bench_engine_step import _ceilings
    from bench_parallel import Runner, _config

    from dsv4.engine.cache import CacheConfig, HybridCache
    from dsv4.model import DeepseekV4ForCausalLM, mixed_steps, prefill_graphs
    prompts = [int(n) for n in args.prompts.split(",")]
    if args.smoke:
        from dsv4.checkpoint.writer import tiny_config
        cfg = tiny_config("fp4", "sliding,csa,hca,csa", vocab_size=2048, sliding_window=128, index_topk=16)
        dev, kernels = torch.device("cpu"), "torch"
    else:
        cfg = _config(os.path.join(os.path.dirname(__file__), "configs", "deepseek-v4-flash.config.json"),
                      args.layers)
        dev, kernels = torch.device("cuda"), "triton"
    print(f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}, {len(cfg.layers)} layers, one fresh "
          f"prompt per forward{', then the MTP block over its rows' if args.mtp else ''}")
    _ceilings(dev.type == "cuda")
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg, torch.bfloat16, kernels=kernels)
    model.load_random_weights(seed=1)
    b = args.decode_rows
    tokens = max(max(prompts), args.ctx + 2 * len(prompts) * (args.reps + 2) if b else 0) + 64
    sizes = CacheConfig.for_capacity(cfg, max_num_seqs=b + 2, max_model_len=tokens, total_tokens=(b + 2) * tokens,
                                     kv_dtype="fp8")
    cache = HybridCache(cfg, sizes, dtype=torch.bfloat16, device=dev)
    model.enable_cuda_graphs(max_batch=max(8, b), capture=dev.type == "cuda")
    run = Runner(model, cfg.vocab_size, dev, cache)
    _capture_report(model, dev, args.mtp)
    decoding = run.new_states(b)
    if b:
        run.prefill(decoding, args.ctx, with_mtp=False)
        print(f"with one decode row of each of {b} sequences at {args.ctx} tokens of context")
    limit = prefill_graphs.PREFILL_MAX_TOKENS
    # mode: (the pieces' limit, mixed steps split, in one pass)
    if b and args.one_pass:
        modes = {"split": (limit, True, False), "one pass": (limit, True, True)}
    elif b:
        modes = {"one forward": (limit, False, False), "split": (limit, True, False)}
    else:
        modes = {"eager": (0, False, False), "pieces": (limit, False, False)}
    (first, second) = modes
    print(f"P tokens | {first} ms | {second} ms | {first} / {second} | pieces bucket")
    for n in prompts:
        times: dict[str, list[float]] = {m: [] for m in modes}
        for rep in range(args.reps + 2):  # two warm-up rounds: compiles, the bucket's capture
            for mode, (max_tokens, split, one_pass) in modes.items():
                prefill_graphs.PREFILL_MAX_TOKENS, mixed_steps.SPLIT_MIXED_STEPS = max_tokens, split
                mixed_steps.ONE_PASS_MIXED_STEPS = one_pass
                ms = _forward_ms(run, n, args.mtp, decoding)
                if rep >= 2:
                    times[mode].append(ms)
        prefill_graphs.PREFILL_MAX_TOKENS, mixed_steps.SPLIT_MIXED_STEPS = limit, False
        mixed_steps.ONE_PASS_MIXED_STEPS = False
        e, g = statistics.median(times[first]), statistics.median(times[second])
        print(f"{n} | {e:.1f} | {g:.1f} | {e / g:.2f} | {prefill_graphs.prefill_bucket_size(n + b)}")


if __name__ == "__main__":
    main()
