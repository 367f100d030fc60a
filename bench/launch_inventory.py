"""Launch inventory of one paged FP8 decode step of the embedded model in kernel mode, on the CPU: every Triton
kernel launch (run by Triton's interpreter) and every torch op that would be a kernel on a GPU, per layer kind and
model part. A planning aid for issue #6's launch removal when no GPU is at hand, not a measurement: the interpreter
skips the Gluon kernels (the persistent MoE GEMVs: their Triton fallbacks are counted), streams run inline (the side
branches' launches are counted in their part), and a few torch paths guarded by `is_cuda` differ. On the GPU,
`bench/profile_step.py` is the measurement.

    python bench/launch_inventory.py [--batch 1] [--flags module.NAME=value ...] [--trace ATEN_OP] [--prefill N]

`--prefill N [--prefix P]`: one fresh N-token prompt (or a chunk of N after P tokens) instead, the eager attention's parts labelled (what runs between the prefill
pieces), the prefill kernel and the fused stores / reads taken as on CUDA (the indexer's selection still takes its
torch path here: two launches on a GPU). `--attend-us R` also times `Attention.attend` over R fresh prompts with
every Triton launch stubbed out: the host's own work per call, a CPU stand-in for what the prefill pieces leave.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

PARTS = [("dsv4.model.block", "Block", "pre"), ("dsv4.model.block", "Block", "_pre_after"),
         ("dsv4.model.attention", "Attention", "_project_and_compress"),
         ("dsv4.model.attention", "Attention", "_attend_step"), ("dsv4.model.attention", "Attention", "finish"),
         ("dsv4.model.moe", "MoE", "forward"), ("dsv4.model.block", "Block", "post")]
# --prefill: the eager attention between the prefill pieces, part by part
PREFILL_PARTS = [("dsv4.model.attention", "Attention", "attend"), ("dsv4.model.compressor", "Compressor", "update"),
                 ("dsv4.model.indexer", "Indexer", "select_indices"),
                 ("dsv4.engine.paged_state", "PagedLayerState", "window"),
                 ("dsv4.engine.paged_state", "PagedLayerState", "entries"),
                 ("dsv4.engine.paged_state", "PagedLayerState", "append_tokens"),
                 ("dsv4.engine.paged_state", "PagedLayerState", "append_stored")]
# aten ops that launch nothing on a GPU (allocation, views, metadata)
NO_KERNEL = {"empty", "empty_strided", "empty_like", "view", "_unsafe_view", "as_strided", "expand", "t", "transpose",
             "permute", "select", "slice", "unsqueeze", "squeeze", "alias", "detach", "lift_fresh", "_reshape_alias",
             "unbind", "split", "split_with_sizes", "chunk", "narrow", "view_as_real", "view_as_complex",
             "_unsafe_index", "new_empty", "new_empty_strided", "set_", "resize_", "is_nonzero", "item",
             "_local_scalar_dense",
             "record_stream", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size", "stride"}
stack: list[str] = []
counts: collections.Counter = collections.Counter()
sites: collections.Counter = collections.Counter()
TRACE = None  # --trace OP
recording = [False]  # counting (off while the interpreter copies a kernel's arguments)


def _labelled(mod: str, cls: str, name: str) -> None:
    klass = getattr(importlib.import_module(mod), cls)
    real = getattr(klass, name)

    def wrapped(self, *a, **k):
        index = getattr(self, "layer_index", None)
        if index is None and hasattr(self, "spec"):
            index = self.spec.index
        layer = f"L{index}" if index is not None else stack[-1].split(" ")[0] if stack else ""
        stack.append(f"{layer} {cls}.{name}".strip())
        try:
            return real(self, *a, **k)
        finally:
            stack.pop()
    setattr(klass, name, wrapped)


def _where() -> str:
    return stack[-1] if stack else "(outside the parts)"


class _TorchOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL and recording[0]:
            counts[(_where(), f"torch {name}")] += 1
            if name == TRACE:  # where in dsv4 such an op comes from (--trace)
                import traceback
                sites[next((f"{f.filename.split('/dsv4/')[-1]}:{f.lineno} {f.line}" for f in
                            reversed(traceback.extract_stack()) if "/dsv4/" in f.filename), "?")] += 1
        return func(*args, **(kwargs or {}))



def _attend_host_us(model, n: int, reps: int) -> None:
    """Microseconds per `Attention.attend` call over `reps` fresh n-token prompts, the Triton launches doing nothing
    (their outputs are garbage; only the host's work is timed: Python, torch dispatch of small CPU ops)."""
    import time

    from dsv4.model.attention import Attention
    from paged_driver import PagedBatch
    from triton.runtime.interpreter import InterpretedFunction

    real_attend, real_run = Attention.attend, InterpretedFunction.run
    spent: dict[str, list[float]] = collections.defaultdict(list)

    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return real_attend(self, *a, **k)
        finally:
            spent["CSA" if self.indexer else "HCA" if self.compressor else "sliding"].append(time.perf_counter() - t)
    InterpretedFunction.run, Attention.attend = (lambda self, *a, **k: None), timed
    try:
        for _ in range(2):  # warm
            PagedBatch(model, "fp8", prompts=(n,))
        spent.clear()
        for _ in range(reps):
            PagedBatch(model, "fp8", prompts=(n,))
    finally:
        InterpretedFunction.run, Attention.attend = real_run, real_attend
    print("host µs per Attention.attend call, launches stubbed (median by layer kind): " + ", ".join(
        f"{kind} {sorted(t)[len(t) // 2] * 1e6:.0f}" for kind, t in sorted(spent.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1, help="sequences, one token each")
    ap.add_argument("--flags", nargs="*", default=[], help="module.NAME=value (Python literal) set before the run")
    ap.add_argument("--trace", help="an aten op name (e.g. _to_copy): also print the dsv4 lines it comes from")
    ap.add_argument("--prefill", type=int, default=0,
                    help="N: instead of a decode step, one fresh N-token prompt, the attention's parts labelled")
    ap.add_argument("--prefix", type=int, default=0, help="with --prefill: the N tokens as a chunk after P of them")
    ap.add_argument("--attend-us", type=int, default=0, metavar="R",
                    help="with --prefill: also R fresh prompts with every Triton launch stubbed out, and the host "
                         "microseconds per `Attention.attend` call (a CPU stand-in for its host time)")
    args = ap.parse_args()
    global TRACE
    TRACE = args.trace
    import ast

    import dsv4
    from dsv4 import load_model
    from paged_driver import PagedBatch
    from triton.runtime.interpreter import InterpretedFunction

    for flag in args.flags:
        target, value = flag.split("=", 1)
        mod, name = target.rsplit(".", 1)
        setattr(importlib.import_module(mod), name, ast.literal_eval(value))
    real_run = InterpretedFunction.run

    def run(self, *a, **k):
        if not recording[0]:
            return real_run(self, *a, **k)
        counts[(_where(), self.fn.__name__)] += 1
        recording[0] = False  # (the interpreter's own copies of the arguments are no launches)
        try:
            return real_run(self, *a, **k)
        finally:
            recording[0] = True
    InterpretedFunction.run = run
    for part in PARTS + (PREFILL_PARTS if args.prefill else []):
        _labelled(*part)
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cpu", torch.bfloat16, kernels="triton")
    if args.prefill:  # the CUDA path's choices (kernel mode's fused stores and reads, the prefill kernel)
        from dsv4.model.attention import Attention
        Attention._prefill_kernel = lambda self, pre: self.use_kernels and pre.q.dtype == torch.bfloat16
        PagedBatch(model, "fp8", prompts=(args.prefill,))  # warm: first-use derivations
        batch = PagedBatch(model, "fp8", prompts=(args.prefix,)) if args.prefix else None
        title = f"one {args.prefill}-token chunk after {args.prefix}" if args.prefix else \
            f"one fresh {args.prefill}-token prompt"
        if args.attend_us:
            _attend_host_us(model, args.prefill, args.attend_us)
    else:
        batch = PagedBatch(model, "fp8", prompts=tuple(9 + 5 * i for i in range(args.batch)))
        batch.decode(1)  # warm: first-use derivations (cos / sin tables, stacks)
        title = f"one decode step, B = {args.batch}"
    recording[0] = True
    with _TorchOps():
        if args.prefix:
            with torch.no_grad():
                batch.forward(batch.seqs, torch.randint(2, 500, (args.prefill,)))
        elif args.prefill:  # a new batch prefills its prompt (the pools' allocation: outside the parts)
            PagedBatch(model, "fp8", prompts=(args.prefill,))
        else:
            batch.decode(1)
    recording[0] = False
    kinds = {f"L{s.index}": ("sliding" if not s.compress_ratio else "CSA" if s.has_indexer else "HCA")
             for s in model.config.layers}
    per_part: dict = collections.defaultdict(collections.Counter)
    for (where, what), n in counts.items():
        layer = where.split(" ")[0]
        key = f"{kinds[layer]:8s} {where}" if layer in kinds else where
        per_part[key][what] += n
    total = sum(counts.values())
    print(f"{title}, {len(model.layers)} layers ({', '.join(kinds.values())}): {total} "
          f"launches ({sum(n for (w, k), n in counts.items() if not k.startswith('torch'))} Triton)")
    for key in sorted(per_part):
        c = per_part[key]
        print(f"{sum(c.values()):4d}  {key}: " + ", ".join(f"{k} {n}" if n > 1 else k for k, n in c.most_common()))
    for site, n in sites.most_common(20):
        print(f"{n:4d}  {args.trace} at {site}")


if __name__ == "__main__":
    main()
