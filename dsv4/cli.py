"""`dsv4` command line. Each subcommand is one entry in COMMANDS: (help, add_arguments, run).

To add a subcommand, write `_add_x(parser)` and `_run_x(args) -> int` and add one COMMANDS line.
Errors print one line to stderr (no traceback) and give a non-zero exit status; logs go to stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Callable

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


# ---- inspect ---------------------------------------------------------------------------------

def _add_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", help="checkpoint directory (validated completely)")
    p.add_argument("--expected", metavar="CONFIG.json",
                   help="print the inventory this config implies instead (no weights needed)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-mtp", action="store_true", help="skip the MTP block (mtp.*)")
    p.add_argument("--progress", action="store_true", help="progress bar while checking scales")


def _run_inspect(args: argparse.Namespace) -> int:
    from dsv4.checkpoint.inspect import format_report, inspect_checkpoint, inspect_expected

    if (args.dir is None) == (args.expected is None):
        raise ValueError("give either a checkpoint DIR or --expected CONFIG.json")
    if args.expected:
        report = inspect_expected(args.expected, include_mtp=not args.no_mtp)
    else:
        report = inspect_checkpoint(args.dir, include_mtp=False if args.no_mtp else None,
                                    progress=args.progress)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


# ---- make-tiny -------------------------------------------------------------------------------

def _add_make_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="output directory")
    p.add_argument("--expert-dtype", choices=("fp4", "fp8"), default="fp4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", default="sliding,csa,hca,csa",
                   help="comma-separated attention kinds, one per layer (sliding, csa, hca)")
    p.add_argument("--unquantized", action="store_true", help="write BF16 weights, no quantization_config")
    p.add_argument("--num-shards", type=int, default=None, help="default: one shard per layer")


def _run_make_tiny(args: argparse.Namespace) -> int:
    from dsv4.checkpoint.writer import make_tiny

    out = make_tiny(args.out, expert_dtype=args.expert_dtype, seed=args.seed, layers=args.layers,
                    quantized=not args.unquantized, num_shards=args.num_shards)
    print(f"wrote tiny DeepSeek-V4 checkpoint to {out}")
    return 0


def _lazy(module: str, attr: str) -> Callable:
    """Import heavy subcommands (engine, server) only when they are used."""
    def call(*args):
        import importlib
        return getattr(importlib.import_module(module), attr)(*args)
    return call


COMMANDS: dict[str, tuple[str, AddArguments, Run]] = {
    "inspect": ("validate and summarise a checkpoint", _add_inspect, _run_inspect),
    "make-tiny": ("write a random tiny checkpoint in the official format", _add_make_tiny, _run_make_tiny),
    "generate": ("generate text for one or more prompts", _lazy("dsv4.cli_generate", "add_generate_arguments"),
                 _lazy("dsv4.cli_generate", "run_generate")),
    "chat": ("interactive chat (streaming)", _lazy("dsv4.cli_generate", "add_chat_arguments"),
             _lazy("dsv4.cli_generate", "run_chat")),
    "bench": ("generation throughput (and speculative-decoding acceptance)",
              _lazy("dsv4.cli_bench", "add_arguments"), _lazy("dsv4.cli_bench", "run")),
    "plan": ("check whether a model's weights and cache fit on N GPUs",
             _lazy("dsv4.planner", "add_arguments"), _lazy("dsv4.planner", "run")),
    "serve": ("OpenAI-compatible HTTP server", _lazy("dsv4.serve.cli_serve", "add_arguments"),
              _lazy("dsv4.serve.cli_serve", "run")),
    "run-batch": ("answer a JSONL file of OpenAI batch requests (chat, completions, responses)",
                  _lazy("dsv4.serve.run_batch", "add_arguments"), _lazy("dsv4.serve.run_batch", "run")),
}


PARALLEL_COMMANDS = ("generate", "serve", "bench", "run-batch")  # accept --tp/--ep (ranks spawned, or joined under torchrun)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsv4", description="DeepSeek-V4 inference engine")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        if name in PARALLEL_COMMANDS:
            from dsv4.distributed.cli import add_parallel_arguments
            add_parallel_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return int(e.code or 0)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command in PARALLEL_COMMANDS:
            from dsv4.distributed.cli import run_parallel, wants_parallel
            if wants_parallel(args):
                return int(run_parallel(args.command, args, argv) or 0)
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("dsv4: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError; message names file/tensor
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"dsv4 {args.command}: error: {msg}", file=sys.stderr)
        return 1
