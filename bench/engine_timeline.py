"""Where the GPU waits for the host in `LLMEngine.step` (bench_engine_step.py --timeline).

The engine's parts (scheduler, speculator, cache run, sampler, model forwards) are labelled with
`record_function` on one engine instance; `steps` steps run under the torch profiler (host and CUDA). Per part:
calls and host ms per step (inclusive: nested parts count in their callers too), the ms per step the GPU sat
idle while the host was inside it (idle: no kernel or copy of any stream runs), and the kernels the part launched
(graph replays included) with their GPU ms per step. Then the kernels launched outside the model's forward, by GPU
time. The profiler slows kernels too (≈ 30 % on the H200 for graphed decode steps): compare parts, not totals.
"""
from __future__ import annotations

import collections
import functools

import torch

# (attribute path on the engine, method): the parts a step is cut into
PARTS = [("scheduler", "schedule"), ("scheduler", "schedule_continuation"), ("scheduler", "postprocess"),
         ("speculator", "propose"), ("speculator", "verify"), ("speculator", "advance"), ("cache", "run"),
         ("sampler", "pick_sequences"), ("sampler", "sample_sequences"), ("model", "forward"),
         ("model", "forward_mtp"), ("model", "compute_logits")]


def _label(obj, name: str, label: str) -> None:
    inner = getattr(obj, name)

    @functools.wraps(inner)
    def labelled(*a, **k):
        with torch.profiler.record_function(label):
            return inner(*a, **k)
    setattr(obj, name, labelled)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _overlap(a: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a[1], e) - max(a[0], s)) for s, e in spans)


def subtree_kernels(e) -> list:
    """The kernels a profiled host event launched, itself or through its children."""
    out = list(e.kernels)
    for c in e.cpu_children:
        out += subtree_kernels(c)
    return out


def timeline(engine, steps: int) -> str:
    """Profile `steps` engine steps; return the table (ms per step)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    labels = []
    for owner, name in PARTS:
        obj = getattr(engine, owner, None)
        if obj is not None and hasattr(obj, name):
            _label(obj, name, f"{owner}.{name}")
            labels.append(f"{owner}.{name}")
    cuda_on = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda_on else (lambda: None)
    for _ in range(2):
        engine.step()
    sync()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda_on else [])]) as prof:
        for _ in range(steps):
            with record_function("engine.step"):
                engine.step()
        sync()
    if not engine.scheduler.running or engine.scheduler.waiting:
        raise RuntimeError("timeline: the requests ended (or were preempted) within the profiled steps")
    events = prof.events()
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    host = [e for e in events if e.device_type == cpu]
    step_spans = [(e.time_range.start, e.time_range.end) for e in host if e.name == "engine.step"]
    t0, t1 = min(s for s, _ in step_spans), max(e for _, e in step_spans)
    busy = _union([(e.time_range.start, e.time_range.end) for e in events if e.device_type == cuda
                   and t1 >= e.time_range.start and e.time_range.end >= t0])
    idle, at = [], t0  # the complement of busy within the profiled steps
    for s, e in busy:
        if s > at:
            idle.append((at, min(s, t1)))
        at = max(at, e)
    if at < t1:
        idle.append((at, t1))
    launched = {e.name: [] for e in host if e.name in labels}
    for e in host:
        if e.name in launched:
            launched[e.name] += subtree_kernels(e)
    rows = []
    waits = [e for e in host if "Synchronize" in e.name]
    for label in ["engine.step", *labels, "(host waits: cuda*Synchronize)"]:
        spans = ([(e.time_range.start, e.time_range.end) for e in waits] if label.startswith("(")
                 else [(e.time_range.start, e.time_range.end) for e in host if e.name == label])
        if not spans:
            continue
        ks = launched.get(label, [])
        rows.append(f"{label:40s} | {len(spans) / steps:5.2f} | {sum(e - s for s, e in spans) / steps / 1e3:8.3f} | "
                    f"{sum(_overlap(sp, idle) for sp in spans) / steps / 1e3:8.3f} | {len(ks) / steps:7.1f} | "
                    f"{sum(k.duration for k in ks) / steps / 1e3:7.3f}")
    total = sum(e - s for s, e in idle) / steps / 1e3
    head = (f"timeline over {steps} steps: {(t1 - t0) / steps / 1e3:.3f} ms per step, GPU idle {total:.3f} ms per step\n"
            f"{'part':40s} | calls | host ms | GPU idle ms | kernels | GPU ms (per step)")
    inside = {id(k) for k in launched.get("model.forward", [])}
    outside, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.device_type == cuda and id(e) not in inside and e.name not in launched and e.name != "engine.step":
            outside[e.name[:70]] += e.time_range.elapsed_us()
            count[e.name[:70]] += 1
    tail = [f"kernels outside model.forward, GPU ms per step (total {sum(outside.values()) / steps / 1e3:.3f}):"]
    tail += [f"  {us / steps / 1e3:7.3f} {count[n] / steps:5.1f}  {n}" for n, us in outside.most_common(14)]
    return "\n".join([head, *rows, *tail])
