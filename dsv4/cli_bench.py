"""`dsv4 bench`: end-to-end generation throughput of a checkpoint (+ speculative-decoding stats).

Random prompt token ids (seeded), greedy decoding with ignore_eos so every request produces exactly
--output-len tokens. Prints one JSON object on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .cli_generate import add_decode_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory (default: the embedded tiny model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--numerics", default="reference", choices=["reference", "transformers"])
    p.add_argument("--batch", type=int, default=16, help="concurrent requests")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative", choices=["mtp"], default=None)
    p.add_argument("--num-draft-tokens", type=int, default=1)
    add_decode_options(p)


def check_arguments(args: argparse.Namespace) -> None:
    for name in ("batch", "prompt_len", "output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")


def engine_limits(args: argparse.Namespace) -> dict:
    """max_num_seqs / max_num_batched_tokens / max_model_len for the benchmark's workload."""
    return dict(max_num_seqs=args.batch, max_num_batched_tokens=max(args.batch * args.prompt_len, 256),
                max_model_len=args.prompt_len + args.output_len + 1)


def run(args: argparse.Namespace) -> int:
    from .engine.llm_engine import EngineConfig, LLMEngine

    check_arguments(args)
    ec = EngineConfig(**engine_limits(args), speculative=args.speculative, num_draft_tokens=args.num_draft_tokens,
                      kv_dtype=getattr(args, "kv_dtype", None), overlap=getattr(args, "overlap", None),
                      prefill_graph_tokens=getattr(args, "prefill_graph_tokens", None))
    engine = LLMEngine.from_pretrained(args.model, device=args.device, numerics=args.numerics, engine_config=ec,
                                       cuda_graphs=args.cuda_graphs)
    report(measure(engine, args, engine), args)
    return 0


def measure(core, args: argparse.Namespace, engine) -> dict:
    """Run the workload through `core` (an LLMEngine, or rank 0's DistributedEngine) and time it."""
    import torch

    from .engine.sampling_params import SamplingParams

    g = torch.Generator().manual_seed(args.seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    for i in range(args.batch):
        ids = torch.randint(2, engine.vocab_size, (args.prompt_len,), generator=g).tolist()
        core.add_request(f"bench-{i}", ids, params)
    t0 = time.perf_counter()
    first_token_at = None
    steps = 0
    while core.has_unfinished():
        outs = core.step()
        steps += 1
        if first_token_at is None and any(o.token_ids for o in outs):
            first_token_at = time.perf_counter()
    end = time.perf_counter()
    if first_token_at is None:
        first_token_at = end
    stats = core.stats()
    decode_tokens = args.batch * (args.output_len - 1)
    speculative = getattr(args, "speculative", None)
    return {
        "model": engine.model_name, "device": str(engine.device), "batch": args.batch,
        "prompt_len": args.prompt_len, "output_len": args.output_len, "steps": steps,
        "prefill_tok_per_s": args.batch * args.prompt_len / max(first_token_at - t0, 1e-9),
        "decode_tok_per_s": decode_tokens / max(end - first_token_at, 1e-9),
        "total_s": end - t0, "overlap": engine.overlap,
        # the defaults as resolved on this device (`llm_engine.default_kv_dtype`, `graphs_by_default`)
        "kv_dtype": engine.cache.cache_config.kv_dtype,
        "cuda_graphs": engine.cuda_graphs,
        "speculative": speculative, "num_draft_tokens": args.num_draft_tokens if speculative else 0,
        "spec_acceptance_rate": stats.spec_acceptance_rate,
        "spec_mean_accepted_length": stats.spec_mean_accepted_length,
    }


def report(result: dict, args: argparse.Namespace) -> None:
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")
