"""Diagnostic (session 46): the embedded model's PagedBatch logits (tests/paged_driver.py, 12 decode steps) differ
between the first model run in a process and later ones (s46c: 7.8e-3, later runs equal to each other). Three runs,
each with forward hooks recording every module's outputs: the first modules whose outputs differ between runs, and
the Triton kernels each run compiled (a later run compiling a new specialisation of a kernel names a suspect)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))


def main() -> None:
    from triton.runtime.jit import JITFunction

    import dsv4
    from dsv4 import load_model
    from paged_driver import PagedBatch
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    compiled: list[list[str]] = []
    real_compile = JITFunction._do_compile

    def logged(self, key, signature, device, constexprs, options, attrs, warmup):
        spec = ",".join(f"{k}" for k in signature.values())[:80]
        compiled[-1].append(f"{self.fn.__name__} [{spec}] attrs={str(attrs)[:160]}")
        return real_compile(self, key, signature, device, constexprs, options, attrs, warmup)

    JITFunction._do_compile = logged
    hooks = "--hooks" in sys.argv
    runs, traces = [], []
    for rep in range(3):
        compiled.append([])
        model = load_model(path, torch.device("cuda"), torch.bfloat16, kernels="triton")
        trace: list[tuple[str, torch.Tensor]] = []
        if hooks:
            def hook(mod, args, out, name=None):
                outs = out if isinstance(out, (tuple, list)) else (out,)
                for j, o in enumerate(outs):
                    if isinstance(o, torch.Tensor) and o.is_floating_point():
                        trace.append((f"{name}[{j}]", o.detach().float().cpu()))
            for name, mod in model.named_modules():
                if name:
                    mod.register_forward_hook(lambda m, a, o, name=name: hook(m, a, o, name))
        runs.append(torch.cat(PagedBatch(model, "fp8").decode(12)))
        traces.append(trace)
        del model
    for rep in (1, 2):
        d = float((runs[rep].double() - runs[rep - 1].double()).abs().max())
        print(f"logits run {rep} vs {rep - 1}: max |diff| {d:.3e}; kernels compiled in run {rep}: "
              f"{len(compiled[rep])} (run 0: {len(compiled[0])})", flush=True)
        for line in compiled[rep][:12]:
            print("   ", line)
    if hooks:
        shown = 0
        for i, ((n0, t0), (n1, t1)) in enumerate(zip(traces[0], traces[1])):
            if n0 != n1 or t0.shape != t1.shape:
                print(f"trace diverges at call {i}: {n0} vs {n1}")
                break
            if not torch.equal(t0, t1):
                print(f"call {i}: {n0} {tuple(t0.shape)} max |diff| {float((t0 - t1).abs().max()):.3e}")
                shown += 1
                if shown == 8:
                    break
        print(f"{len(traces[0])} module outputs recorded per run")


if __name__ == "__main__":
    main()
