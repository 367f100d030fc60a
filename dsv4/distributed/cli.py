"""`dsv4 generate|serve|bench|run-batch ... --tp N --ep M` and `torchrun --nproc-per-node W -m dsv4 generate|...`.

Wiring (dsv4/cli.py): add `add_parallel_arguments(p)` to the generate and serve parsers, and in
`main`, after parsing, `if wants_parallel(args): return run_parallel(args.command, args, argv)`.
Until then (and for tests) `python -m dsv4.distributed.cli generate|serve ...` is the same thing.
Without a launcher environment `run_parallel` re-runs the same command line as max(N, M) ranks
(`launcher.spawn_ranks`); inside one it joins the group, loads this rank's shard and runs: rank 0
prints / serves HTTP with a `DistributedEngine`, the other ranks follow in `worker_loop`.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dsv4.distributed.parallel_state import MOE_COMM


def add_parallel_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel (docs/parallel.md)")
    g.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel ranks: attention heads, shared expert, vocabulary")
    g.add_argument("--ep", type=int, default=None,
                   help="expert-parallel ranks: routed experts split by expert. The run uses max(tp, ep) "
                        "processes; under torchrun without --tp/--ep, tp = ep = WORLD_SIZE")
    g.add_argument("--moe-comm", choices=MOE_COMM, default="allreduce",
                   help="how expert outputs are combined across ranks (default allreduce)")


def wants_parallel(args: argparse.Namespace) -> bool:
    from dsv4.distributed.launcher import under_launcher
    if under_launcher() and int(os.environ["WORLD_SIZE"]) > 1:
        return True
    return max(getattr(args, "tp", None) or 1, getattr(args, "ep", None) or 1) > 1


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def run_parallel(command: str, args: argparse.Namespace, argv: list[str] | None = None,
                 module: str = "dsv4") -> int:
    from dsv4.distributed import launcher
    from dsv4.distributed.parallel_state import ParallelConfig, destroy_parallel

    if command not in _COMMANDS:
        raise ValueError(f"dsv4 {command} does not run on several processes (supported: {', '.join(_COMMANDS)})")
    _check_speculative(args)
    if getattr(args, "cuda_graphs", False) and (getattr(args, "device", None) == "cpu"
                                                or not _cuda_available()):
        raise ValueError("--cuda-graphs needs CUDA devices (each rank captures its decode steps on its GPU)")
    if not launcher.under_launcher():
        tp, ep = launcher.resolve_sizes(args.tp, args.ep)
        world = ParallelConfig(tp, ep, args.moe_comm).world_size  # validates before starting anything
        return launcher.spawn_ranks(list(sys.argv[1:] if argv is None else argv), world, module)
    ps = launcher.init_from_env(args.tp, args.ep, args.moe_comm, getattr(args, "device", None))
    try:
        return _COMMANDS[command](args, ps)
    finally:
        destroy_parallel()


def _model_path(args: argparse.Namespace) -> Path:
    from dsv4.engine.assets import default_model_path
    path = Path(args.model) if args.model else default_model_path()
    if not path.is_dir():
        raise ValueError(f"--model {args.model}: not a directory")
    return path


def _check_speculative(args: argparse.Namespace) -> None:
    """--speculative / --num-draft-tokens, checked before any rank starts (the MTP block: as from_pretrained)."""
    from dsv4.cli_generate import check_draft_tokens
    from dsv4.engine.spec_decode import mtp_problem
    check_draft_tokens(args)
    speculative = getattr(args, "speculative", None)
    if speculative and (problem := mtp_problem(_model_path(args))):
        raise ValueError(f"--speculative {speculative} needs the checkpoint's complete MTP block: {problem}")


def build_engine(args: argparse.Namespace, ps, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048):
    """This rank's LLMEngine around its shard of --model (default: the embedded tiny model)."""
    import torch

    from dsv4.chat.tokenizer import load_tokenizer
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.memory_fit import load_fitting
    from dsv4.serve.cli_serve import prefix_snapshots

    path = _model_path(args)
    dtype = torch.float32 if ps.device.type == "cpu" else torch.bfloat16
    speculative = getattr(args, "speculative", None)
    model = load_fitting(path, ps.device, dtype=dtype, numerics=getattr(args, "numerics", "reference"),
                         include_mtp=speculative is not None, parallel=ps)
    config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=args.max_model_len, kv_dtype=getattr(args, "kv_dtype", None),
                          speculative=speculative, num_draft_tokens=getattr(args, "num_draft_tokens", 1),
                          overlap=getattr(args, "overlap", None), retain_finished=getattr(args, "retain_finished", 0),
                          share_prompts=getattr(args, "share_prompts", True),
                          prefix_snapshots=prefix_snapshots(args) if hasattr(args, "prefix_snapshots") else 0,
                          cache_tokens=getattr(args, "cache_tokens", None),
                          prefill_graph_tokens=getattr(args, "prefill_graph_tokens", None))
    # every rank captures the same steps, its collectives inside; only when asked (None: off), until the two-GPU
    # token test against eager steps has run (docs/parallel.md)
    if getattr(args, "cuda_graphs", None):
        model.enable_cuda_graphs(max_batch=config.decode_step_rows)
    return LLMEngine(model, model.config, load_tokenizer(path), config, model_name=path.name)


def _generate(args: argparse.Namespace, ps) -> int:
    from dsv4.cli_generate import sampling_params
    from dsv4.distributed.engine import lockstep

    params = sampling_params(args, 0.0)  # a bad option fails before any rank loads weights
    engine = build_engine(args, ps)

    def lead(core) -> int:
        if engine.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json: prompts cannot be encoded")
        stream = len(args.prompt) == 1 and not args.no_stream
        texts = {}
        for i, prompt in enumerate(args.prompt):
            core.add_request(f"gen-{i}", engine.tokenizer.encode(prompt), params)
            texts[f"gen-{i}"] = ""
        while core.has_unfinished():
            for out in core.step():
                texts[out.request_id] += out.text
                if stream:
                    sys.stdout.write(out.text)
                    sys.stdout.flush()
        sys.stdout.write("\n" if stream else "".join(t + "\n" for t in texts.values()))
        return 0

    return lockstep(engine, ps, lead) or 0


def _serve(args: argparse.Namespace, ps) -> int:
    from dsv4.distributed.engine import lockstep
    from dsv4.serve.cli_serve import serve_options
    from dsv4.serve.server import serve

    engine = build_engine(args, ps, args.max_num_seqs, args.max_num_batched_tokens)
    return lockstep(engine, ps, lambda core: serve(core, serve_options(args, engine.model_name))) or 0


def _bench(args: argparse.Namespace, ps) -> int:
    from dsv4.cli_bench import check_arguments, engine_limits, measure, report
    from dsv4.distributed.engine import lockstep

    check_arguments(args)
    limits = engine_limits(args)
    args.max_model_len = limits["max_model_len"]
    engine = build_engine(args, ps, limits["max_num_seqs"], limits["max_num_batched_tokens"])

    def lead(core) -> int:
        result = measure(core, args, engine)
        result.update(tp=ps.tp, ep=ps.ep, moe_comm=ps.moe_comm)
        report(result, args)
        return 0

    return lockstep(engine, ps, lead) or 0


def _run_batch(args: argparse.Namespace, ps) -> int:
    from dsv4.distributed.engine import lockstep
    from dsv4.serve.run_batch import answer, check

    requests = check(args)  # a bad file fails before any rank loads weights
    engine = build_engine(args, ps, args.max_num_seqs, args.max_num_batched_tokens)
    return lockstep(engine, ps, lambda core: answer(core, args, requests, engine.model_name)) or 0


_COMMANDS = {"generate": _generate, "serve": _serve, "bench": _bench, "run-batch": _run_batch}


def main(argv: list[str] | None = None) -> int:
    """`python -m dsv4.distributed.cli generate|serve ...`: the dsv4 subcommands' own options plus
    --tp/--ep/--moe-comm (the same code path as the wired `dsv4` command)."""
    from dsv4.cli_bench import add_arguments as add_bench_arguments
    from dsv4.cli_generate import add_generate_arguments

    def add_serve_arguments(p):  # the server's modules need uvicorn: import them only to serve
        from dsv4.serve.cli_serve import add_arguments
        add_arguments(p)

    def add_batch_arguments(p):
        from dsv4.serve.run_batch import add_arguments
        add_arguments(p)

    parser = argparse.ArgumentParser(prog="python -m dsv4.distributed.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, add in (("generate", add_generate_arguments), ("serve", add_serve_arguments),
                      ("bench", add_bench_arguments), ("run-batch", add_batch_arguments)):
        p = sub.add_parser(name)
        if name == command:
            add(p)
            add_parallel_arguments(p)
    args = parser.parse_args(argv)
    try:
        return run_parallel(args.command, args, argv, module="dsv4.distributed.cli")
    except ValueError as e:
        print(f"dsv4 {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
