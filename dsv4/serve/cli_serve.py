"""`dsv4 serve`: command-line options, engine construction, then `server.serve`.

Wired into dsv4/cli.py as COMMANDS["serve"] = (help, add_arguments, run).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..cli_generate import add_cache_tokens, add_decode_options, check_cache_tokens, check_draft_tokens


API_KEY_ENV = "DSV4_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stderr)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV})")
    p.add_argument("--allowed-origins", metavar="ORIGINS", default="",
                   help="comma-separated browser origins allowed to call the API (CORS), e.g. "
                        "'https://chat.example.com'; '*' allows any (default: none)")
    g = p.add_argument_group("serving limits")
    g.add_argument("--max-queued", type=int, default=256,
                   help="sequences waiting beyond --max-num-seqs; more are refused with 429")
    g.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="largest request body")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish after SIGTERM")
    g.add_argument("--step-watchdog", type=float, default=120.0,
                   help="an engine step longer than this marks the server unhealthy and fails its requests")
    g.add_argument("--responses-store", type=int, default=256, metavar="N",
                   help="keep the last N /v1/responses in memory for previous_response_id (0: none)")
    g.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))


PREFIX_SNAPSHOTS = 16  # --prefix-snapshots' default


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The model and engine options (`dsv4 serve`, `dsv4 run-batch`)."""
    p.add_argument("--model", metavar="DIR",
                   help="checkpoint directory (config.json, *.safetensors, tokenizer.json); "
                        "default: the tiny model shipped inside the package")
    p.add_argument("--served-model-name", metavar="NAME", nargs="+",
                   help="the model ids clients may send, all listed by /v1/models; replies name the one sent "
                        "(default: the directory name)")
    p.add_argument("--default-thinking", action="store_true",
                   help="chat requests think unless they turn it off (default: chat mode)")
    g = p.add_argument_group("engine")
    g.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    g.add_argument("--numerics", default="reference", choices=["reference", "transformers"])
    g.add_argument("--max-model-len", type=int, default=4096, help="prompt + completion tokens per request")
    g.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together at most")
    add_cache_tokens(g)
    g.add_argument("--max-num-batched-tokens", type=int, default=8192,  # EngineConfig.max_num_batched_tokens
                   help="tokens per engine step at most (chunked prefill budget)")
    g.add_argument("--speculative", choices=["mtp"], default=None,
                   help="speculative decoding: 'mtp' drafts with the checkpoint's own mtp.0 block")
    g.add_argument("--num-draft-tokens", type=int, default=1, help="draft tokens per step with --speculative (1-4)")
    g.add_argument("--retain-finished", type=int, default=32, metavar="N",
                   help="keep up to N finished sequences' cache (and chat turns' copies where the next turn departs "
                        "from their prompt) for prompts that continue them: a conversation's next turn or an agent's "
                        "next step prefills only its new tokens; the pages give way before anybody is preempted "
                        "(default 32: a chat turn keeps two, its prompt's end and its end; 0: off)")
    g.add_argument("--prefix-snapshots", type=int, default=None, metavar="N",
                   help="keep up to N snapshots of prompt prefixes that several requests share (a system prompt): "
                        f"the second request with a prefix keeps it, later ones compute only the rest (default "
                        f"{PREFIX_SNAPSHOTS}, 0 with --no-share-prompts; 0: off)")
    g.add_argument("--no-share-prompts", dest="share_prompts", action="store_false",
                   help="compute every request's prompt itself (default: n choices and repeated prompts arriving "
                        "together compute it once, the others copy its cache)")
    add_decode_options(g)


def _check(args: argparse.Namespace) -> None:
    check_engine_arguments(args)
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if args.max_queued < 0:
        raise ValueError(f"--max-queued must be >= 0, got {args.max_queued}")
    if args.responses_store < 0:
        raise ValueError(f"--responses-store must be >= 0, got {args.responses_store}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.shutdown_timeout < 0 or args.step_watchdog <= 0:
        raise ValueError("--shutdown-timeout must be >= 0 and --step-watchdog > 0")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty")
    allowed_origins(args.allowed_origins)


def allowed_origins(text: str) -> tuple[str, ...]:
    """--allowed-origins: '*' or origins like 'https://host[:port]' (ValueError naming a bad one)."""
    origins = tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    for o in origins:
        if o != "*" and not re.fullmatch(r"https?://[^/\s]+", o):
            raise ValueError(f"--allowed-origins: {o!r} is not an origin (scheme://host[:port]) or '*'")
    return origins


def prefix_snapshots(args: argparse.Namespace) -> int:
    """--prefix-snapshots, its default resolved: on where forks are (they copy the snapshots), else 0."""
    if args.prefix_snapshots is None:
        return PREFIX_SNAPSHOTS if args.share_prompts else 0
    return args.prefix_snapshots


def check_engine_arguments(args: argparse.Namespace) -> None:
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    check_cache_tokens(args)
    if args.retain_finished < 0:
        raise ValueError(f"--retain-finished must be >= 0, got {args.retain_finished}")
    snapshots = prefix_snapshots(args)
    if snapshots < 0:
        raise ValueError(f"--prefix-snapshots must be >= 0, got {snapshots}")
    if snapshots and not args.share_prompts:
        raise ValueError("--prefix-snapshots needs prompt sharing: drop --no-share-prompts")
    names = args.served_model_name or []
    if any(not n.strip() for n in names) or len(set(names)) < len(names):
        raise ValueError(f"--served-model-name: names must be non-empty and distinct, got {names}")


def serve_options(args: argparse.Namespace, model_name: str):
    """Validated server options from parsed arguments (shared by every engine core)."""
    from .server import ServeOptions  # lazy: building the CLI parser must not import uvicorn
    _check(args)
    names = args.served_model_name or [model_name]
    return ServeOptions(model_name=names[0], model_aliases=tuple(names[1:]), host=args.host, port=args.port,
                        api_key=args.api_key, max_running=args.max_num_seqs, max_queued=args.max_queued,
                        shutdown_timeout=args.shutdown_timeout, step_watchdog_s=args.step_watchdog,
                        max_body_bytes=args.max_body_bytes, default_thinking=args.default_thinking,
                        log_level=args.log_level, responses_store=args.responses_store,
                        allowed_origins=allowed_origins(args.allowed_origins))


def build_core(args: argparse.Namespace):
    """The real engine core (imported lazily: building the parser must not import torch)."""
    from ..engine.llm_engine import EngineConfig, LLMEngine

    if args.model is not None and not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model}: not a directory")
    check_draft_tokens(args)
    config = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=args.max_model_len, speculative=args.speculative,
                          num_draft_tokens=args.num_draft_tokens, kv_dtype=getattr(args, "kv_dtype", None),
                          overlap=getattr(args, "overlap", None), retain_finished=args.retain_finished,
                          share_prompts=args.share_prompts, prefix_snapshots=prefix_snapshots(args),
                          cache_tokens=args.cache_tokens,
                          prefill_graph_tokens=getattr(args, "prefill_graph_tokens", None))
    return LLMEngine.from_pretrained(args.model, device=args.device, numerics=args.numerics, engine_config=config,
                                     cuda_graphs=getattr(args, "cuda_graphs", None))


def run(args: argparse.Namespace) -> int:
    from .server import exit_process, serve
    _check(args)   # bad options fail before the (slow) model load
    core = build_core(args)
    capture = getattr(core, "capture_prefill_graphs", None)  # (before the first request: none waits for a capture)
    captured = capture() if capture is not None else ""
    if captured:
        print(f"dsv4 serve: {captured}", file=sys.stderr, flush=True)
    exit_process(serve(core, serve_options(args, core.model_name)))
    return 0   # not reached
