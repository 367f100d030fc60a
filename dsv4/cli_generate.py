"""`dsv4 generate` and `dsv4 chat`: stdout carries only generated text; logs go to stderr."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory (default: the embedded tiny model)")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument("--numerics", default="reference", choices=["reference", "transformers"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy (default 0 for generate, 1.0 for chat)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when the output contains TEXT (cut from it); repeat for several")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    add_cache_tokens(p)
    p.add_argument("--speculative", choices=["mtp"], default=None,
                   help="speculative decoding: 'mtp' drafts with the checkpoint's own mtp.0 block")
    p.add_argument("--num-draft-tokens", type=int, default=1, metavar="K",
                   help="draft tokens per step with --speculative (1-4; default 1)")
    g = p.add_argument_group("structured output (one of)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="SCHEMA", help="the output is JSON following SCHEMA (a file or JSON text)")
    g.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    g.add_argument("--regex", help="the output matches this regular expression")
    g.add_argument("--choice", action="append", metavar="TEXT", help="the output is one of these; repeat for each")
    g.add_argument("--grammar", metavar="FILE", help="the output follows this Lark grammar (llguidance's dialect)")
    add_decode_options(p)


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("prompt", nargs="+", help="prompt text (several prompts are batched)")
    p.add_argument("--no-stream", action="store_true", help="print each result when complete")


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--thinking", action="store_true", help="thinking mode (reasoning shown on stderr)")
    p.add_argument("--system", default=None, help="system prompt")


def add_decode_options(p) -> None:
    """--cuda-graphs, --kv-dtype and --no-overlap (generate, chat, bench, serve: a parser or an argument group)."""
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="decode steps as CUDA graphs, one graph per step (default: on for one GPU with the Triton "
                        "kernels; across --tp/--ep ranks only when asked, until its two-GPU token test has run)")
    p.add_argument("--kv-dtype", choices=["auto", "fp8"], default=None,
                   help="KV cache storage: 'auto' = the model dtype, 'fp8' = e4m3 + E8M0 nope dims, FP4 indexer keys "
                        "(lossless under reference numerics; the GPU decode kernel reads it). Default: fp8 on a GPU "
                        "under reference numerics, else auto")
    p.add_argument("--prefill-graph-tokens", type=_prefill_graph_tokens, default=None, metavar="N",
                   help="with CUDA graphs, prompts and chunks of up to N tokens per step run as piecewise graphs "
                        "(0: none, and their GPU memory, ≈ 1.3 GiB for Flash, stays free; default and most: 2048)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                   help="read each decode step's ids back before launching the next (default on a GPU: launch the "
                        "next first, so the host's work hides behind the GPU)")


def _prefill_graph_tokens(text: str) -> int:
    from .model.prefill_graphs import PREFILL_BUCKETS
    top = max(PREFILL_BUCKETS)
    if not text.isdigit() or int(text) > top:
        raise argparse.ArgumentTypeError(f"expected 0 (off) to {top} (the largest prefill bucket), got {text!r}")
    return int(text)


def add_cache_tokens(g) -> None:
    """--cache-tokens (serve, run-batch, generate, chat, --tp/--ep runs)."""
    g.add_argument("--cache-tokens", type=int, default=None, metavar="N",
                   help="tokens of context the cache holds over all sequences (`dsv4 plan` prints how many fit the "
                        "GPUs; default: max-num-seqs x max-model-len / 4, at least two full-length sequences)")


def check_cache_tokens(args: argparse.Namespace) -> None:
    n = getattr(args, "cache_tokens", None)
    if n is not None and n < args.max_model_len:
        raise ValueError(f"--cache-tokens {n} is less than --max-model-len {args.max_model_len}: a request of full "
                         "length would never fit")


def check_draft_tokens(args) -> None:
    """--num-draft-tokens only means something with --speculative (generate, chat, serve, every --tp/--ep run)."""
    if getattr(args, "num_draft_tokens", 1) != 1 and getattr(args, "speculative", None) is None:
        raise ValueError("--num-draft-tokens needs --speculative mtp")


def _llm(args, retain_finished: int = 0):
    from .engine.llm import LLM
    check_draft_tokens(args)
    check_cache_tokens(args)
    return LLM(args.model, device=args.device, numerics=args.numerics, max_model_len=args.max_model_len,
               progress=len(getattr(args, "prompt", [])) > 1, speculative=args.speculative,
               num_draft_tokens=args.num_draft_tokens, cuda_graphs=getattr(args, "cuda_graphs", None),
               kv_dtype=getattr(args, "kv_dtype", None), overlap=getattr(args, "overlap", None),
               retain_finished=retain_finished, cache_tokens=args.cache_tokens,
               prefill_graph_tokens=getattr(args, "prefill_graph_tokens", None))


def _read(value: str, what: str) -> str:
    """A file's text, or for --json-schema the value itself when it is JSON text rather than a path."""
    if what == "--json-schema" and value.lstrip().startswith("{"):
        return value
    try:
        return Path(value).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{what} {value}: cannot read it ({e.strerror})") from None


def structured_output(args):
    """--json-schema / --json-object / --regex / --choice / --grammar as a StructuredOutput (None: none given)."""
    from .engine.structured import StructuredOutput
    schema, grammar = getattr(args, "json_schema", None), getattr(args, "grammar", None)
    json_object, regex, choice = getattr(args, "json_object", False), getattr(args, "regex", None), \
        getattr(args, "choice", None)
    if not (schema or json_object or regex or choice or grammar):
        return None
    return StructuredOutput(json=_read(schema, "--json-schema") if schema else None, json_object=json_object,
                            regex=regex, choice=choice, grammar=_read(grammar, "--grammar") if grammar else None)


def sampling_params(args, default_temperature: float):
    """The sampling options of generate / chat (one or many ranks) as SamplingParams (a bad value: its ValueError
    names the field)."""
    from .engine.sampling_params import SamplingParams
    t = default_temperature if args.temperature is None else args.temperature
    return SamplingParams(temperature=t, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty, stop=args.stop, seed=args.seed,
                          max_tokens=args.max_tokens, structured=structured_output(args))


def run_generate(args) -> int:
    params = sampling_params(args, 0.0)  # a bad option fails before the model loads
    llm = _llm(args)
    if len(args.prompt) == 1 and not args.no_stream:
        for d in llm.stream(args.prompt, params):
            sys.stdout.write(d.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    for r in llm.generate(args.prompt, params):
        sys.stdout.write(r.text + "\n")
    return 0


def run_chat(args) -> int:
    from dataclasses import replace

    from .chat.encoding import continuation_tokens, encode_messages
    from .chat.parser import StreamingParser, prompt_ends_in_reasoning
    from .engine.structured import after_reasoning
    params = sampling_params(args, 1.0)
    # each turn's prompt continues the last one (history + reply): it adopts that turn's cache and prefills only the
    # new tokens (dsv4.engine.retention); where thinking drops the reasoning from the history, the cache kept is the
    # one at the end of the prompt but its last token (`<think>`, which the next turn renders as `</think>`)
    llm = _llm(args, retain_finished=1)
    if llm.tokenizer is None:
        raise ValueError("chat needs a tokenizer; this checkpoint has no tokenizer.json")
    mode = "thinking" if args.thinking else "chat"
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            sys.stderr.write("you> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            return 0
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.strip() in ("/exit", "/quit"):
            return 0
        history.append({"role": "user", "content": line})
        prompt = encode_messages(history, thinking_mode=mode)
        ids = llm.tokenizer.encode(prompt)
        in_reasoning = prompt_ends_in_reasoning(prompt)
        parser = StreamingParser(mode, in_reasoning=in_reasoning)
        # a structured output applies to the answer, not the reasoning
        turn = after_reasoning(params, llm.tokenizer.think_close_id) if in_reasoning else params
        turn = replace(turn, retain_prefix=continuation_tokens(llm.tokenizer, ids, history, prompt,
                                                                        thinking_mode=mode))
        for d in llm.stream([ids], turn):
            events = parser.feed(d.text) + (parser.finish() if d.finished else [])
            for e in events:
                if "reasoning_content" in e:
                    sys.stderr.write(e["reasoning_content"])
                elif "content" in e:
                    sys.stdout.write(e["content"])
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        msg = parser.result()
        history.append({"role": "assistant", "content": msg["content"],
                        "reasoning_content": msg["reasoning_content"] or None})
