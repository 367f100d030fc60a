"""Where one eager decode step's GPU kernels come from: 4 Flash-shaped layers (sliding, sliding, CSA,
HCA), random weights, paged FP8 pools, batch 1 at context 1024. Prints kernels and GPU microseconds
per model part (torch profiler; parts are labelled with record_function). A development aid for
issue #6's fusion work, not a benchmark.

    python bench/profile_step.py [--layers 4] [--batch 1] [--ctx 1024] [--prefill N]

`--prefill N` profiles one N-token prefill of a fresh sequence instead (after one warm-up prefill);
`--prefix P` makes that prefill a chunk after P tokens of the same prompt (the engine's token budget per step);
`--cprofile` Python's profile of eager decode steps (with `--prefill N --pieces`: of prompts through the prefill
pieces, whose host time is the eager attention's); `--timeline` one captured decode step as a host / GPU
timeline (where the GPU idles around the graph); `--host` the host's side of captured decode steps
(CPU time per op and labelled Python part; `--eager`: of eager ones); with `--syncs` also the lines where
such a step makes the host wait for the GPU.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PARTS = [("dsv4.model.block", "Block", "pre"), ("dsv4.model.attention", "Attention", "prepare"),
         ("dsv4.model.attention", "Attention", "_attend_step"), ("dsv4.model.attention", "Attention", "finish"),
         ("dsv4.model.moe", "MoE", "forward"), ("dsv4.model.block", "Block", "post"),
         ("dsv4.model.indexer", "Indexer", "pick_padded"), ("dsv4.model.indexer", "Indexer", "queries"),
         ("dsv4.model.compressor", "Compressor", "project"), ("dsv4.engine.paged_decode", "DecodeStep", "derive"),
         ("dsv4.model.attention", "Attention", "attend"), ("dsv4.model.indexer", "Indexer", "select_indices"),
         ("dsv4.model.moe", "Gate", "forward"), ("dsv4.model.moe", "Expert", "forward"),
         ("dsv4.model.block", "Block", "forward")]


HOST_PARTS = [("dsv4.model.graphs", "_StepBucket", "run"), ("dsv4.engine.paged_decode", "DecodeStep", "fill"),
              ("dsv4.model.deepseek_v4", "DeepseekV4ForCausalLM", "forward"),
              ("dsv4.model.deepseek_v4", "DeepseekV4ForCausalLM", "compute_logits"),
              ("dsv4.engine.cache", "HybridCache", "reserve"), ("dsv4.model.graphs", "DecodeGraphs", "paged_step")]


def _label(mod, cls, name):
    import importlib
    klass = getattr(importlib.import_module(mod), cls)
    real = getattr(klass, name)

    @functools.wraps(real)
    def f(*a, **k):
        with torch.profiler.record_function(f"{cls}.{name}"):
            return real(*a, **k)
    setattr(klass, name, f)


def _list_syncs(call) -> None:
    """Run `call` with CUDA sync debugging on; print each dsv4 line that made the host wait."""
    import traceback
    import warnings
    sites = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack() if "/dsv4/" in f.filename]
        if frames:
            f = frames[-1]
            sites[f"{f.filename.split('/dsv4/')[-1]}:{f.lineno} {f.line}"] += 1
    old = warnings.showwarning
    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
    torch.cuda.synchronize()
    print(f"host waits in the call: {sum(sites.values())} at {len(sites)} places")
    for site, n in sites.most_common(25):
        print(f"  {n:5d}  {site}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--prefill", type=int, default=0, help="profile an N-token prefill instead of a decode step")
    p.add_argument("--prefix", type=int, default=0, help="with --prefill: that chunk after this many tokens of the "
                   "same prompt (as the engine's token budget per step splits a long prompt)")
    p.add_argument("--syncs", action="store_true", help="also list where the profiled call waits for the GPU")
    p.add_argument("--order", action="store_true", help="also list each layer's kernels in launch order")
    p.add_argument("--cprofile", action="store_true",
                   help="instead: Python's profiler over eager decode steps or, with --prefill, fresh prompts (where the "
                   "host's time goes, by function)")
    p.add_argument("--eager", action="store_true", help="with --host: eager steps instead of captured ones")
    p.add_argument("--pieces", action="store_true",
                   help="with --prefill --cprofile: the prompts through the prefill pieces (CUDA graphs on), so the "
                        "profile shows the host time left between them (the eager attention)")
    p.add_argument("--timeline", action="store_true",
                   help="instead: one captured decode step (read back as the engine does) as a host / GPU timeline: "
                        "where the GPU idles between the graph, the LM head and the pick; with --prefill: the "
                        "host's lead on the GPU per kernel of a fresh prompt's forward and the idle it costs")
    p.add_argument("--kernels", action="store_true", help="with --timeline: also every kernel of the captured step "
                   "(bench/timeline_exposed.py reads that table by its chain of ends)")
    p.add_argument("--host", action="store_true",
                   help="instead: the host's side of captured decode steps (CPU time per torch op / Python part); "
                   "with --prefill: of eager prefill forwards")
    args = p.parse_args()
    if args.prefill:  # (--host: room for the fresh prompts it profiles)
        args.batch, args.ctx = 6 if args.host or args.cprofile else 1, args.prefill + args.prefix
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_parallel import Runner, _config  # noqa: E402
    from dsv4.engine.cache import CacheConfig, HybridCache
    from dsv4.model import DeepseekV4ForCausalLM
    cfg = _config(os.path.join(os.path.dirname(__file__), "configs", "deepseek-v4-flash.config.json"), args.layers)
    dev = torch.device("cuda")
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg, torch.bfloat16, kernels="triton")
    model.load_random_weights(seed=1)
    cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=args.batch + 1, max_model_len=args.ctx + 64,
                                                      total_tokens=(args.batch + 1) * (args.ctx + 64), kv_dtype="fp8"), dtype=torch.bfloat16, device=dev)
    run = Runner(model, cfg.vocab_size, dev, cache)
    if ((args.host or args.timeline) and not args.eager) or args.pieces:
        model.enable_cuda_graphs(max_batch=max(args.batch, 1))
    states = run.new_states(args.batch)
    run.prefill(states, args.ctx, with_mtp=False)
    one = [1] * args.batch
    for _ in range(3):
        run.forward(states, one)
    if args.prefill:  # the profiled call: a fresh sequence's whole prompt in one forward (or a chunk of it)
        run.release(states)
        for _ in range(2):  # the chunk once for its kernels' compiles, once timed
            print(f"{args.prefill}-token chunk after {args.prefix}: {_chunk_ms(run, args.prefill, args.prefix):.1f} "
                  "ms wall")
        states = _fresh(run, args.prefix)
        one = [args.prefill]
    if args.cprofile:
        (_cprofile_prefill if args.prefill else _cprofile)(run, states, one)
        return
    if args.timeline:
        if args.prefill:
            _lead_prefill(run, states, one)
        else:
            _timeline(run, states, one, kernels=args.kernels)
        return
    if args.host and args.prefill:
        _profile_host_prefill(run, args.prefill, args.prefix)
        return
    if args.host:
        if args.syncs:  # the lines where a captured decode step still makes the host wait
            _list_syncs(lambda: run.forward(states, one))
        _profile_host(run, states, one)
        return
    for part in PARTS:
        _label(*part)
    torch.cuda.synchronize()
    if args.syncs:
        _list_syncs(lambda: run.forward(states, one))
        if args.prefill:
            run.release(states)
            states = _fresh(run, args.prefix)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run.forward(states, one)
        torch.cuda.synchronize()
    events = prof.events()
    labels = {f"{c}.{n}" for _, c, n in PARTS}  # record_function ranges show up as GPU events too
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in labels]
    what = f"{args.prefill}-token prefill" if args.prefill else "eager step"
    print(f"{len(gpu)} kernels, {sum(e.device_time for e in gpu):.0f} us GPU in one {what} "
          f"({args.layers} layers, batch {args.batch}, ctx {args.ctx})")

    from engine_timeline import subtree_kernels
    table = collections.defaultdict(lambda: [0, 0, 0.0])
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and any(e.name == f"{c}.{n}" for _, c, n in PARTS):
            ks = subtree_kernels(e)
            row = table[e.name]
            row[0] += 1
            row[1] += len(ks)
            row[2] += sum(k.duration for k in ks)
    print(f"{'part (nested parts counted in both)':40s} {'calls':>5} {'kernels':>8} {'GPU us':>8}")
    for name, (calls, n, us) in sorted(table.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:40s} {calls:5d} {n:8d} {us:8.0f}")
    if args.prefill:
        run.release(states)
        _per_layer(run, _fresh(run, args.prefix), [args.prefill], args.prefill)
    if args.order:
        _print_order(events, gpu)
    names = collections.Counter(e.name[:60] for e in gpu)
    times = collections.Counter()
    for e in gpu:
        times[e.name[:60]] += e.device_time
    print("kernels by GPU time (us, launches):")
    for name, us in times.most_common(int(os.environ.get("TOP", "25"))):
        print(f"  {us:8.0f} {names[name]:5d}  {name}")


def _per_layer(run, states, one, tokens: int) -> None:
    """Each layer's GPU span in one more prefill (CUDA events around each Block.forward on the current stream; the
    8K forward is GPU-bound, so the spans are its layers' GPU time), by kind, and the full Flash model's time
    per kind: the mean span of each kind x its count among the released config's layers, plus the forward's
    time outside the layers. (The 8-layer wall time scaled by 43 / 8 weighs the kinds as the first 8 layers
    do: 2 SWA, 3 CSA, 3 HCA; the model has 2, 21, 20.)"""
    import json

    from dsv4.model.block import Block
    with open(os.path.join(os.path.dirname(__file__), "configs", "deepseek-v4-flash.config.json")) as f:
        full = json.load(f)
    ratios = full["compress_ratios"][:full["num_hidden_layers"]]
    kind = {0: "SWA", 4: "CSA", 128: "HCA"}
    marks = []
    real = Block.forward

    def timed(*a, **k):
        ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev[0].record()
        out = real(*a, **k)
        ev[1].record()
        marks.append(ev)
        return out
    Block.forward = timed
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run.forward(states, one)
        end.record()
        torch.cuda.synchronize()
    finally:
        Block.forward = real
    per_kind = collections.defaultdict(list)
    for i, (a, b) in enumerate(marks):
        ms = a.elapsed_time(b)
        per_kind[kind[ratios[i]]].append(ms)
        print(f"layer {i} ({kind[ratios[i]]}): {ms:7.2f} ms")
    total = start.elapsed_time(end)
    rest = total - sum(sum(v) for v in per_kind.values())
    counts = {k: sum(kind[r] == k for r in ratios) for k in per_kind}
    est = rest + sum(sum(v) / len(v) * counts[k] for k, v in per_kind.items())
    print(f"forward {total:.1f} ms; full model ({len(ratios)} layers, {counts}; kinds absent here not counted): "
          f"{est:.1f} ms = {tokens / est * 1e3:,.0f} tok/s (outside the layers {rest:.2f} ms)")


def _cprofile(run, states, one, steps: int = 10) -> None:
    """Eager decode steps' wall time, then cProfile's functions by cumulative and by own time."""
    import cProfile
    import pstats
    import time
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        run.forward(states, one)
    torch.cuda.synchronize()
    print(f"eager decode step wall {(time.perf_counter() - t) / steps * 1e3:.2f} ms ({steps} steps)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        run.forward(states, one)
    torch.cuda.synchronize()
    prof.disable()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof).sort_stats(key).print_stats(22)


def _cprofile_prefill(run, states, one, steps: int = 5) -> None:
    """cProfile's functions by own and by cumulative time over fresh prompts of one[0] tokens (compiled first)."""
    import cProfile
    import pstats
    n = one[0]
    _chunk_ms(run, n, 0)  # (the fresh prompts' shapes compile here)
    fresh = [run.new_states(1) for _ in range(steps)]
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for st in fresh:
        run.forward(st, [n])
    torch.cuda.synchronize()
    prof.disable()
    print(f"cProfile over {steps} fresh {n}-token prompts (per-call times are totals over the {steps})")
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof).sort_stats(key).print_stats(int(os.environ.get("TOP", "30")))
    for pattern in filter(None, os.environ.get("CALLERS", "").split(",")):  # e.g. CALLERS="method 'to'"
        pstats.Stats(prof).sort_stats("tottime").print_callers(pattern)


def _profile_host(run, states, one, steps: int = 10) -> None:
    """Wall time of whole decode steps vs their graph's GPU time, and where the host's time goes."""
    import time
    from torch.profiler import ProfilerActivity, profile, record_function
    for _ in range(3):
        run.forward(states, one)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        run.forward(states, one)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / steps * 1e3
    for part in HOST_PARTS + PARTS:  # (the model's parts run only in eager steps)
        _label(*part)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("Runner.forward"):
                run.forward(states, one)
        torch.cuda.synchronize()
    print(f"decode step wall {wall:.2f} ms (back to back, {steps} steps); host CPU time by op, per step:")
    rows = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:30]
    print(f"{'op':50s} {'calls':>6} {'total ms':>9} {'self ms':>8}")
    for e in rows:
        print(f"{e.key[:50]:50s} {e.count // steps:6d} {e.cpu_time_total / 1e3 / steps:9.3f} "
              f"{e.self_cpu_time_total / 1e3 / steps:8.3f}")


def _fresh(run, prefix: int):
    """A new sequence's state with `prefix` tokens of its prompt already run, in the engine's 8K chunks (one
    forward of 139K tokens through 4 layers ran out of an H100's memory, session 69)."""
    st = run.new_states(1)
    if prefix:
        run.prefill(st, prefix, with_mtp=False)
    return st


def _chunk_ms(run, n: int, prefix: int) -> float:
    """Wall milliseconds of one n-token forward after `prefix` tokens of the same prompt (a fresh sequence,
    released afterwards)."""
    st = _fresh(run, prefix)
    torch.cuda.synchronize()
    t = time.perf_counter()
    run.forward(st, [n])
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) * 1e3
    run.release(st)
    return ms


def _profile_host_prefill(run, n: int, prefix: int, steps: int = 5) -> None:
    """Eager prefill forwards of n tokens (after `prefix` tokens of the same prompt): their wall time, then where
    the host's time goes in fresh n-token prompts (no prefix inside the profile, so its forward does not count)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    walls = [_chunk_ms(run, n, prefix) for _ in range(steps + 1)][1:]  # (the first compiles)
    _chunk_ms(run, n, 0)  # the profiled prompts' own shapes compile here (the top-k's block follows the key count)
    for part in PARTS:
        _label(*part)
    states = [run.new_states(1) for _ in range(steps)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for st in states:
            with record_function("Runner.forward"):
                run.forward(st, [n])
        torch.cuda.synchronize()
    print(f"{n}-token prefill forward after {prefix}: wall {sorted(walls)[len(walls) // 2]:.1f} ms (median of "
          f"{steps}); host CPU time by op and part in fresh {n}-token prompts, per forward:")
    rows = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:int(os.environ.get("TOP", "40"))]
    print(f"{'op':50s} {'calls':>6} {'total ms':>9} {'self ms':>8}")
    for e in rows:
        print(f"{e.key[:50]:50s} {e.count // steps:6d} {e.cpu_time_total / 1e3 / steps:9.3f} "
              f"{e.self_cpu_time_total / 1e3 / steps:8.3f}")


def _timeline(run, states, one, steps: int = 4, gap_us: float = 4.0, kernels: bool = False) -> None:
    """The last of `steps` decode steps (each read back with .tolist(), as the engine's sampler does) as a
    timeline in ms from the step's start: the host's labelled parts and runtime calls (≥ 10 µs), the GPU's busy
    time, and every GPU idle gap longer than `gap_us` with the kernels around it; `kernels`: also every GPU
    kernel of the step in start order (µs from the first, its span, its stream: the replayed graph's overlap)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    for part in HOST_PARTS:
        _label(*part)
    for _ in range(3):
        run.forward(states, one).tolist()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("step"):
                run.forward(states, one).tolist()
        torch.cuda.synchronize()
    events = prof.events()
    cpu = torch.autograd.DeviceType.CPU
    step = max((e for e in events if e.name == "step" and e.device_type == cpu), key=lambda e: e.time_range.start)
    t0, t1 = step.time_range.start, step.time_range.end
    gpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "step"
                  and t0 <= e.time_range.start <= t1), key=lambda e: e.time_range.start)
    if not gpu:
        print("timeline: no GPU events in the step (profiler without CUDA?)")
        return
    busy, end = 0.0, t0  # the union of the GPU intervals (the side stream's overlap the main stream's)
    for e in gpu:
        busy += max(0.0, e.time_range.end - max(e.time_range.start, end))
        end = max(end, e.time_range.end)
    print(f"decode step: {(t1 - t0) / 1e3:.3f} ms on the host (start to read-back); GPU busy {busy / 1e3:.3f} ms in "
          f"{len(gpu)} kernels / copies, first at +{(gpu[0].time_range.start - t0) / 1e3:.3f}, last ends at "
          f"+{(gpu[-1].time_range.end - t0) / 1e3:.3f} ms")
    if kernels:
        g0 = gpu[0].time_range.start
        print("GPU kernels (µs from the first: start, span, stream, name):")
        for e in gpu:
            stream = getattr(e, "device_resource_id", "?")
            print(f"  {e.time_range.start - g0:8.1f} {e.time_range.elapsed_us():6.1f} s{stream}  {e.name[:90]}")
    labels = {f"{c}.{n}" for _, c, n in HOST_PARTS}
    print("host (ms from the step's start):")
    for e in sorted((e for e in events if e.device_type == cpu and t0 <= e.time_range.start <= t1
                     and (e.name in labels or (e.name.startswith("cuda") and e.time_range.elapsed_us() >= 10))),
                    key=lambda e: e.time_range.start):
        print(f"  +{(e.time_range.start - t0) / 1e3:7.3f} .. +{(e.time_range.end - t0) / 1e3:7.3f}  {e.name[:70]}")
    print(f"GPU idle gaps over {gap_us:.0f} µs:")
    end, prev = t0, "(step start)"
    for e in gpu:
        if e.time_range.start - end > gap_us:
            print(f"  +{(end - t0) / 1e3:7.3f} .. +{(e.time_range.start - t0) / 1e3:7.3f}  "
                  f"{(e.time_range.start - end):7.1f} µs  after {prev[:40]}  before {e.name[:40]}")
        if e.time_range.end > end:
            end, prev = e.time_range.end, e.name


def _lead_prefill(run, states, one) -> None:
    """One fresh prompt's eager forward: is the host or the GPU the bound? Per kernel, the host's lead = its GPU
    start minus the end of its launch call (one stream: launches and kernels pair in order). A kernel that starts
    within a few µs of its launch waited for the host; the GPU's idle time before such kernels is the host's cost,
    summed here by the labelled part that launched them."""
    from torch.profiler import ProfilerActivity, profile
    n = one[0]
    _chunk_ms(run, n, 0)  # (compiles the fresh prompt's shapes)
    for part in PARTS:
        _label(*part)
    st = run.new_states(1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run.forward(st, [n])
        torch.cuda.synchronize()
    events = prof.events()
    cpu = torch.autograd.DeviceType.CPU
    labels = {f"{c}.{m}" for _, c, m in PARTS}  # (record_function ranges show up as GPU events too)
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in labels),
                     key=lambda e: e.time_range.start)
    launches = sorted((e for e in events if e.device_type == cpu and ("LaunchKernel" in e.name
                       or e.name.startswith(("cudaMemcpy", "cudaMemset")))), key=lambda e: e.time_range.start)
    if len(launches) != len(kernels) or not kernels:
        print(f"lead: {len(launches)} launch calls vs {len(kernels)} GPU events; not paired")
        return
    idle_by, waited, end = collections.Counter(), 0, kernels[0].time_range.start
    busy = 0.0
    for call, k in zip(launches, kernels):
        gap = max(0.0, k.time_range.start - end)
        busy += max(0.0, k.time_range.end - max(k.time_range.start, end))
        if k.time_range.start - call.time_range.end < 5.0:  # the GPU waited for this launch
            waited += 1
            e = call.cpu_parent
            while e is not None and e.name not in labels:
                e = e.cpu_parent
            idle_by[e.name if e is not None else "-"] += gap
        end = max(end, k.time_range.end)
    span = (end - kernels[0].time_range.start) / 1e3
    print(f"{n}-token forward: GPU span {span:.2f} ms, busy {busy / 1e3:.2f} ms, idle {span - busy / 1e3:.2f} ms; "
          f"{waited} of {len(kernels)} kernels started < 5 µs after their launch (waited for the host)")
    print("GPU idle before kernels that waited for the host, by the part that launched them (ms):")
    for name, us in idle_by.most_common(12):
        print(f"  {us / 1e3:7.3f}  {name}")


def _print_order(events, gpu) -> None:
    """The step's kernels in launch order with the innermost labelled part that launched each: the
    runtime's launch calls (CPU events, in order) pair up with the GPU events (one stream, in order)."""
    labels = {f"{c}.{n}" for _, c, n in PARTS}
    launches = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU
                       and ("LaunchKernel" in e.name or e.name.startswith(("cudaMemcpy", "cudaMemset")))),
                      key=lambda e: e.time_range.start)
    kernels = sorted(gpu, key=lambda e: e.time_range.start)
    if len(launches) != len(kernels):
        print(f"order: {len(launches)} launch calls vs {len(kernels)} GPU events; not paired")
        return
    layer = -1
    for call, k in zip(launches, kernels):
        chain, e = [], call.cpu_parent
        while e is not None:
            if e.name in labels:
                chain.append(e)
            e = e.cpu_parent
        if chain and chain[-1].name == "Block.forward":
            blk = chain[-1]
            if blk.id != layer:
                layer = blk.id
                print(f"-- {blk.name} #{blk.id}")
        label = chain[0].name if chain else "-"
        op = call.cpu_parent.name if call.cpu_parent is not None else "-"  # the aten op that launched it
        print(f"  {k.device_time:6.1f}  {label:24s} {op[:28]:28s} {k.name[:80]}")

if __name__ == "__main__":
    main()
