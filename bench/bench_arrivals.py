"""Serving while prompts arrive: B requests decode at P tokens of context, and every K steps a new request of A
prompt tokens arrives (asking for 2 tokens, so the running set stays at about B). The step after an arrival brings
the prompt beside the decode rows (a mixed step); the others are plain decode steps.

Per mode of `mixed_steps.SPLIT_MIXED_STEPS` (off: a mixed step is one forward whose attention walks the sequences
one by one; on: the decode rows as their graphed fixed-shape step, then the prompt; with `--one-pass` the modes are
that split and `mixed_steps.ONE_PASS_MIXED_STEPS` (always, or `same-bucket`: where the decode rows fit in the padding
of the prompt's bucket): one forward, the decode rows attending as their fixed-shape step
inside the prompt's pieces), alternating for R rounds:
the median time of the mixed steps and of the decode steps, and the wall time of all S timed steps with the tokens
they generated (what the running requests see while others arrive). N Flash-shaped layers with random weights made
on the GPU, paged FP8 cache, CUDA graphs, greedy, EOS ignored; the engine's overlap off, so that each arrival joins
the very next step.

    python bench/bench_arrivals.py [--layers 8] [--batch 8] [--prompt 4096] [--arrival 128] [--every 4]
                                   [--steps 32] [--rounds 2] [--one-pass [always|same-bucket]]

It prints the GPU's copy bandwidth and bf16 matmul peak measured first. `--smoke`: a tiny config on the CPU (torch
kernels, no graphs), to check the script itself (tests/test_bench_parallel_smoke.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def run_mode(model, cfg, args, on: bool) -> dict:
    from dsv4.engine.cache import CacheConfig
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.sampling_params import SamplingParams
    from dsv4.model import mixed_steps

    # the mode: the split off / on, or (--one-pass) the split / the one pass (always, or where the rows fit the bucket)
    one_pass = {"always": True, "same-bucket": "same-bucket"}.get(args.one_pass, False)
    mixed_steps.SPLIT_MIXED_STEPS = on or bool(one_pass)
    mixed_steps.ONE_PASS_MIXED_STEPS = one_pass if on else False
    splits = _count_splits()
    cuda = not args.smoke
    decode_tokens = args.steps + 16
    longest = args.prompt + decode_tokens
    arrivals = -(-args.steps // args.every)
    seqs = args.batch + 2  # the running requests and an arrival or two
    pools = CacheConfig.for_capacity(cfg, max_num_seqs=seqs, max_model_len=longest,
                                     total_tokens=args.batch * longest + 2 * (args.arrival + 8),
                                     kv_dtype="fp8" if cuda else "auto")
    engine = LLMEngine(model, cfg, None, EngineConfig(
        max_num_seqs=seqs, max_num_batched_tokens=max(args.prompt, 2048), max_model_len=longest, cache=pools,
        overlap=False))  # (with overlap the arrival could join the step after the look-ahead one: no clean split)
    g = torch.Generator().manual_seed(args.batch)
    tokens = lambda n: torch.randint(2, cfg.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"r{i}", tokens(args.prompt), params)
    while any(len(s.output_token_ids) == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # every running request has its first token
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request("warm", tokens(args.arrival), short)  # warm-up: a mixed step and decode steps
    for _ in range(4):
        engine.step()
    mixed, plain = [], []
    made = engine.generation_tokens_total
    splits.clear()
    start = time.perf_counter()
    for s in range(args.steps):
        arrived = s % args.every == 0
        if arrived:
            engine.add_request(f"a{s}", tokens(args.arrival), short)
        t = time.perf_counter()
        engine.step()
        (mixed if arrived else plain).append((time.perf_counter() - t) * 1e3)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    made = engine.generation_tokens_total - made
    for rid in list(engine.scheduler.requests):
        engine.abort_request(rid)
    del engine
    if cuda:
        torch.cuda.empty_cache()
    return {"on": on, "mixed_ms": statistics.median(mixed), "plain_ms": statistics.median(plain),
            "wall_ms": wall * 1e3, "tokens": made, "arrivals": arrivals, "split_steps": sum(splits)}


def _count_splits() -> list[bool]:
    """A list that records, per forward of the timed steps, whether the model split it (mixed_steps)."""
    from dsv4.model import deepseek_v4, mixed_steps
    seen: list[bool] = []

    def spy(*args):
        out = mixed_steps.split_mixed_step(*args)
        seen.append(out is not None)
        return out

    deepseek_v4.split_mixed_step = spy
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="requests decoding throughout")
    p.add_argument("--prompt", type=int, default=4096, help="their prompt tokens (the decode rows' context)")
    p.add_argument("--arrival", type=int, default=128, help="prompt tokens of each arriving request")
    p.add_argument("--every", type=int, default=4, help="steps between arrivals")
    p.add_argument("--steps", type=int, default=32, help="timed steps per mode and round")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the two modes, alternating")
    p.add_argument("--one-pass", nargs="?", const="always", choices=("always", "same-bucket"),
                   help="the modes: the split against the one pass (mixed_steps.ONE_PASS_MIXED_STEPS)")
    p.add_argument("--smoke", action="store_true", help="tiny config on the CPU (checks the script)")
    args = p.parse_args()
    if args.every < 2 or args.steps < args.every:
        p.error("--every must be >= 2 and --steps >= --every (both kinds of step are timed)")
    from bench_engine_step import _ceilings, _model

    model, cfg = _model(SimpleNamespace(smoke=args.smoke, layers=args.layers, batches=str(args.batch + 2),
                                        speculative=0))
    print(f"{torch.cuda.get_device_name() if not args.smoke else 'CPU'}, {len(cfg.layers)} layers: {args.batch} "
          f"requests decoding at {args.prompt} tokens of context, a {args.arrival}-token prompt arriving every "
          f"{args.every} steps, {args.steps} steps timed per mode and round")
    _ceilings(not args.smoke)
    rows = {False: [], True: []}
    for _ in range(args.rounds):
        for on in (False, True):
            rows[on].append(run_mode(model, cfg, args, on))
    print(f"{'one pass' if args.one_pass else 'split'} | mixed step ms | decode step ms | tok/s over the timed "
          "steps | steps split / arrivals | rounds")
    for on, runs in rows.items():
        med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        rate = statistics.median(r["tokens"] / r["wall_ms"] * 1e3 for r in runs)
        print(f"{'on' if on else 'off'} | {med('mixed_ms'):.2f} | {med('plain_ms'):.2f} | {rate:.0f} | "
              f"{runs[-1]['split_steps']} / {runs[-1]['arrivals']} | {len(runs)}")


if __name__ == "__main__":
    main()
