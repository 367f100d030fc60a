"""CPU throughput of the engine on the embedded tiny model: prefill and decode tokens/s per batch size.

For each batch size B: B random prompts of --prompt-len tokens, greedy, --gen-tokens new tokens each
(EOS ignored), through `LLMEngine` with a token budget that prefills every prompt in one step. The
first step (prefill of all prompts + their first sampled token) gives prefill tok/s = B * prompt_len
/ time; every later step is a pure decode step of B rows, giving decode tok/s = B * steps / time.
Median over --repeats runs after one warm-up run. Prints the machine, the command and a markdown table
(the "CPU (embedded model)" section of docs/benchmarks.md).

    python bench/bench_cpu.py                      # embedded model, torch's default threads
    python bench/bench_cpu.py --threads 1 --batch-sizes 1,4,16
    python bench/bench_cpu.py --random-tiny        # random weights, same shapes as the embedded model
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import dsv4  # noqa: E402
from dsv4.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from dsv4.engine.sampling_params import SamplingParams  # noqa: E402


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def random_tiny_checkpoint(directory: Path) -> Path:
    """Random weights in the embedded model's shapes (tools/train_tiny.py model_config)."""
    from dsv4.checkpoint.writer import random_master_weights, tiny_config, write_checkpoint
    cfg = tiny_config("fp4", "sliding,csa,hca,csa", vocab_size=2048, num_attention_heads=2, sliding_window=128,
                      num_hash_layers=2, index_topk=16, n_routed_experts=4)
    return write_checkpoint(directory, cfg, random_master_weights(cfg, seed=0))


def run_once(model, batch: int, prompt_len: int, gen_tokens: int, seed: int) -> tuple[float, float, int]:
    """(prefill seconds, decode seconds, decode steps) of one batch."""
    vocab = model.config.vocab_size
    engine = LLMEngine(model, model.config, None, EngineConfig(
        max_num_seqs=batch, max_num_batched_tokens=batch * prompt_len, max_model_len=prompt_len + gen_tokens))
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.0, max_tokens=gen_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{i}", torch.randint(2, vocab, (prompt_len,), generator=g).tolist(), params)
    t0 = time.perf_counter()
    first = engine.step()
    t1 = time.perf_counter()
    if len(first) != batch:
        raise RuntimeError(f"prefill step produced {len(first)} first tokens for {batch} prompts")
    steps = 0
    while engine.has_unfinished():
        out = engine.step()
        if len(out) != batch and engine.has_unfinished():
            raise RuntimeError(f"decode step produced {len(out)} tokens for {batch} rows")
        steps += 1
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the embedded tiny model)")
    p.add_argument("--random-tiny", action="store_true", help="random weights in the embedded model's shapes")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--numerics", default="reference", choices=["reference", "transformers"])
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    tmp = None
    if args.random_tiny:
        tmp = tempfile.TemporaryDirectory()
        path, what = random_tiny_checkpoint(Path(tmp.name)), "random tiny checkpoint (embedded model's shapes)"
    elif args.model:
        path, what = Path(args.model), args.model
    else:
        from dsv4.engine.assets import default_model_path
        path, what = default_model_path(), "embedded model dsv4/assets/tiny"
    model = dsv4.load_model(path, dtype=dtype, numerics=args.numerics)
    batches = [int(b) for b in args.batch_sizes.split(",")]

    load_before = os.getloadavg()[0]
    run_once(model, 2, 16, 4, seed=0)  # warm-up: first-call allocations, lazy inits
    rows = []
    for b in batches:
        runs = [run_once(model, b, args.prompt_len, args.gen_tokens, seed=r) for r in range(args.repeats)]
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        steps = runs[0][2]
        rows.append((b, b * args.prompt_len / prefill, b * steps / decode, 1000 * decode / steps))
        print(f"batch {b}: prefill {rows[-1][1]:.0f} tok/s, decode {rows[-1][2]:.1f} tok/s", file=sys.stderr)

    cfg = model.config
    print(f"- date: {datetime.date.today().isoformat()}")
    env = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY") if k in os.environ]
    command = [*env, "python bench/bench_cpu.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    print(f"- command: `{' '.join(command)}`")
    print(f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; 1-min load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after (other processes share the cores)")
    print(f"- model: {what} ({cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
          f"window {cfg.window}), {args.dtype}, numerics={args.numerics}")
    print(f"- workload: prompts of {args.prompt_len} random tokens, {args.gen_tokens} greedy tokens each, "
          f"median of {args.repeats} runs")
    print()
    print("| batch | prefill tok/s | decode tok/s | ms per decode step |")
    print("|---:|---:|---:|---:|")
    for b, pf, dc, ms in rows:
        print(f"| {b} | {pf:,.0f} | {dc:,.1f} | {ms:.1f} |")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
