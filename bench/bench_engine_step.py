"""Decode through the engine (`LLMEngine.step`: schedule, tables, graph replay, LM head, greedy pick, read-back,
stop checks, outputs) against the model's own graph replay in the same run: what the engine adds per step.

N Flash-shaped layers with random weights made on the GPU (no disk), paged FP8 cache, CUDA graphs; B requests
of a random P-token prompt, greedy, EOS ignored. Per batch size, with the engine's overlap off and on
(`EngineConfig.overlap`: the next batch launched before the ids are read back), in turn: ms per decode step
through the engine (median and mean over the timed steps), the step's graph replayed back to back, and then
as many steps again under Python's profiler: their time, the part the host waits for the GPU, and where the
rest goes (listed for the last engine of each batch size).

    python bench/bench_engine_step.py [--layers 8] [--batches 1,8] [--prompt 4096] [--steps 32] [--top 25]
                                      [--overlap off|on|both] [--speculative N] [--drafts device|host|both|late|early]
                                      [--temperature T] [--repeat R] [--timeline]

It prints the GPU's copy bandwidth and bf16 matmul peak measured first, and per row the roofline (the bytes a
step reads at that bandwidth). `--speculative N`: MTP with N drafts (random weights accept few: the cost side);
`--drafts`: greedy drafts and verdicts picked on the device, one read-back per step (`MTPSpeculator.on_device`),
or on the host as sampled rows are; `late` / `early` A/B the device path's MTP catch-up after / before the verdict.
`--repeat R`: R rounds of the modes, alternating, and each mode's median over them (A/Bs on a noisy host; no
profile then).
`--timeline`: per mode, where the GPU idles (bench/engine_timeline.py). `--smoke`: a tiny config with random
weights on the CPU (torch kernels, no graphs), to check the script itself (tests/test_bench_parallel_smoke.py).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _model(args):
    from dsv4.model import DeepseekV4ForCausalLM
    if args.smoke:
        from dsv4.checkpoint.writer import tiny_config
        cfg = tiny_config("fp4", "sliding,csa,hca,csa", vocab_size=2048, sliding_window=128, index_topk=16)
        dev, kernels = torch.device("cpu"), "torch"
    else:
        sys.path.insert(0, os.path.dirname(__file__))
        from bench_parallel import _config
        cfg = _config(os.path.join(os.path.dirname(__file__), "configs", "deepseek-v4-flash.config.json"),
                      args.layers)
        dev, kernels = torch.device("cuda"), "triton"
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg, torch.bfloat16, kernels=kernels)
    model.load_random_weights(seed=1)
    if dev.type == "cuda":
        model.enable_cuda_graphs(max_batch=max(int(b) for b in args.batches.split(",")) * (1 + args.speculative))
    return model, cfg


def _host_share(prof: cProfile.Profile, steps: int, top: int) -> tuple[float, str]:
    """(ms per step the host spent waiting for the GPU in read-backs, the top dsv4 functions by cumulative time
    and the top functions by own time)."""
    stats = pstats.Stats(prof)
    waits = ("'tolist'", "'item'", "synchronize")  # read-backs, event and device waits
    wait = sum(tt for (_, _, name), (_, _, tt, _, _) in stats.stats.items() if any(w in name for w in waits))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats("dsv4", top // 2)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    body = "\n".join(line for line in buf.getvalue().splitlines() if line.strip() and "function calls" not in line)
    return wait * 1e3 / steps, body


def run_batch(model, cfg, batch: int, overlap: bool, args, drafts: str = "device") -> dict:
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.sampling_params import SamplingParams
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_parallel import _replay_ms
    cuda = torch.cuda.is_available() and not args.smoke
    from dsv4.engine.cache import CacheConfig
    # every request decodes through the timed and profiled steps (the first ones start while later ones prefill)
    budget = max(args.prompt, 8192)
    new_tokens = (3 if args.timeline else 2) * args.steps + 16 + -(-batch * args.prompt // budget)
    longest = args.prompt + new_tokens
    pools = CacheConfig.for_capacity(cfg, max_num_seqs=batch, max_model_len=longest, total_tokens=batch * longest,
                                     kv_dtype="fp8" if cuda else "auto")  # every request at full length: no preemption
    engine = LLMEngine(model, cfg, None, EngineConfig(
        max_num_seqs=batch, max_num_batched_tokens=budget, max_model_len=longest, cache=pools, overlap=overlap,
        speculative="mtp" if args.speculative else None, num_draft_tokens=max(1, args.speculative)))
    if engine.speculator is not None:
        from dsv4.engine import spec_decode
        engine.speculator.on_device = drafts in ("device", "late")
        spec_decode.EARLY_CATCH_UP = drafts != "late"
        spec_decode.SAMPLED_ON_DEVICE = drafts != "host"  # (sampled rows, --temperature > 0)
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=args.temperature, max_tokens=new_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", torch.randint(2, cfg.vocab_size, (args.prompt,), generator=g).tolist(), params)
    while any(len(s.output_token_ids) == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # prefill (in pieces of the token budget) until every request has its first token
    for _ in range(4):  # warm-up decode steps (graph capture of this bucket)
        engine.step()
    times, first = [], engine.generation_tokens_total
    for _ in range(args.steps):  # timed without the profiler
        before = engine.generation_tokens_total
        t = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - t) * 1e3)
        made = engine.generation_tokens_total - before
        if made != batch and not (args.speculative and made >= batch):
            raise RuntimeError(f"decode step gave {made} tokens for {batch} requests")
    tokens_per_step = (engine.generation_tokens_total - first) / args.steps / batch
    replay = _replay_ms(model, 20) if cuda else 0.0  # this batch's bucket: the last one launched
    profiled_ms = wait_ms = float("nan")
    top = ""
    if args.repeat == 1:  # rounds of an A/B skip the profile
        prof, t = cProfile.Profile(), time.perf_counter()
        prof.enable()
        for _ in range(args.steps):  # the same number of steps again, profiled
            engine.step()
        prof.disable()
        profiled_ms = (time.perf_counter() - t) * 1e3 / args.steps
        wait_ms, top = _host_share(prof, args.steps, args.top)
    if args.timeline:
        from engine_timeline import timeline
        top = timeline(engine, args.steps) + "\n" + top
    for rid in list(engine.scheduler.requests):
        engine.abort_request(rid)
    del engine
    if cuda:
        torch.cuda.empty_cache()
    return {"batch": batch, "overlap": overlap, "drafts": drafts if args.speculative else "", "tokens": tokens_per_step,
            "median_ms": statistics.median(times), "mean_ms": statistics.fmean(times),
            "replay_ms": replay, "profiled_ms": profiled_ms, "wait_ms": wait_ms, "top": top}


def _ceilings(cuda: bool) -> float:
    """Print this GPU's copy bandwidth and bf16 matmul peak, measured now; return the bandwidth (bytes/s, 0 on
    the CPU). The roofline column is the bytes one step reads (bench_parallel's count) at that bandwidth."""
    if not cuda:
        return 0.0
    from bench_parallel import _copy_bandwidth, _median_ms
    copy = _copy_bandwidth(torch.device("cuda"))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = _median_ms(lambda: a @ a, 10)
    print(f"ceilings: copy {copy / 1e12:.2f} TB/s, bf16 matmul {2 * 8192 ** 3 / ms / 1e9:.0f} TFLOP/s")
    return copy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=4096)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--top", type=int, default=25, help="functions listed per batch size (by own time)")
    p.add_argument("--overlap", default="both", choices=["off", "on", "both"])
    p.add_argument("--speculative", type=int, default=0,
                   help="MTP draft tokens per step (0: none); random weights accept few drafts, so this times the "
                        "steps' cost, not MTP's gain")
    p.add_argument("--drafts", default="device", choices=["device", "host", "both", "late", "early"],
                   help="with --speculative: greedy drafts and verdicts picked on the device or on the host; "
                        "late: on the device, the MTP catch-up after the verdict (spec_decode.EARLY_CATCH_UP off); "
                        "early: late and device in turn")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampled requests (greedy by default); with --speculative, `device` draws them on the device "
                        "(spec_decode.SAMPLED_ON_DEVICE), `host` on the host")
    p.add_argument("--repeat", type=int, default=1, help="rounds of the modes per batch size (alternating)")
    p.add_argument("--timeline", action="store_true",
                   help="also profile the steps (torch profiler): per engine part, host ms and GPU idle ms")
    p.add_argument("--smoke", action="store_true", help="embedded model's shapes on the CPU (checks the script)")
    args = p.parse_args()
    model, cfg = _model(args)
    cuda = torch.cuda.is_available() and not args.smoke
    gpu = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{gpu}, {len(cfg.layers)} layers, prompt {args.prompt}, {args.steps} timed decode steps per batch")
    copy = _ceilings(cuda)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.overlap]
    paths = {"both": ["device", "host"], "early": ["late", "device"]}.get(args.drafts, [args.drafts])
    modes = [(o, d) for o in modes for d in paths]
    rows = [run_batch(model, cfg, int(b), o, args, d) for b in args.batches.split(",")
            for _ in range(args.repeat) for o, d in modes]
    from bench_parallel import _decode_roof_bytes
    print("B | overlap | tokens per row and step | engine step ms (median / mean) | roofline ms (x) | graph replay "
          "ms | profiled step ms: all / waiting for the GPU / host busy")
    for r in rows:
        roof = _decode_roof_bytes(model, r["batch"], args.prompt) / copy * 1e3 if copy else float("nan")
        print(f"{r['batch']} | {'on' if r['overlap'] else 'off'}{' ' + r['drafts'] if r['drafts'] else ''} | "
              f"{r['tokens']:.2f} | "
              f"{r['median_ms']:.3f} / {r['mean_ms']:.3f} | "
              f"{roof:.3f} ({r['median_ms'] / roof:.2f}) | {r['replay_ms']:.3f} | {r['profiled_ms']:.3f} / "
              f"{r['wait_ms']:.3f} / {r['profiled_ms'] - r['wait_ms']:.3f}")
    if args.repeat > 1:  # modes alternate within a batch size: each one's median of its rounds' medians
        print(f"B | mode | engine step ms, median of {args.repeat} rounds (each round's median)")
        for b in args.batches.split(","):
            for o, d in modes:
                ms = [r["median_ms"] for r in rows if r["batch"] == int(b) and (r["overlap"], r["drafts"] or "device")
                      == (o, d)]
                print(f"{b} | {'on' if o else 'off'}{' ' + d if args.speculative else ''} | "
                      f"{statistics.median(ms):.3f} ({' '.join(f'{v:.3f}' for v in ms)})")
    for r in rows if args.timeline else rows[len(modes) - 1::len(modes)] if args.repeat == 1 else []:
        print(f"--- B = {r['batch']}, overlap {'on' if r['overlap'] else 'off'} {r['drafts']}: where the profiled "
              f"steps' host time goes")
        print(r["top"])


if __name__ == "__main__":
    main()
