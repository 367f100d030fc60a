"""The transformers port as a peer (issue #6, item 5): its eager `DeepseekV4ForCausalLM` at Flash width with a
few layers, random bf16 weights made on the GPU (no checkpoint, no quantiser: its experts are dense bf16 tensors,
≈ 12.9 GB per layer, so it fits an H200 only for a few layers), timed the way dsv4's rows are:

  decode   one token at batch B after a ctx-token prompt (its own cache), ms per step and per layer
  prefill  one forward over a P-token prompt, tokens/s

Per layer = the step divided by the layer count (the LM head, ≈ 0.26 ms at B = 1, is included in the step).
Run it in the same device call as dsv4's rows (`bench_parallel.py` / `rows8`), since those are the ratio's other
side. Its numerics differ from DeepSeek's on purpose (no FP8 / FP4 simulation, docs/parity.md); only the times
are compared.

    python bench/bench_peer_transformers.py [--layers 4] [--ctx 4096] [--batches 1] [--prefill 8192] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "deepseek-v4-flash.config.json")


def peer_config(layers: int, tiny: bool) -> dict:
    """The released Flash config (or the tests' tiny one) cut to `layers`, unquantised, without the MTP block."""
    if tiny:
        from dsv4.checkpoint.writer import tiny_config
        d = dict(tiny_config("fp4", ",".join(["sliding", "csa", "hca", "csa"][:layers]), quantized=False).raw)
    else:
        with open(CONFIG) as f:
            d = json.load(f)
    d.pop("quantization_config", None)
    d["compress_ratios"] = d["compress_ratios"][:layers] + [0]
    d["num_hidden_layers"] = layers
    d["num_nextn_predict_layers"] = 0
    return d


def timed(fn, dev: torch.device, reps: int) -> float:
    """Median ms of `reps` calls (after one warm-up), synchronised around each."""
    fn()
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="first N layers of Flash (4: sliding, sliding, CSA, HCA)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny width (a CPU smoke run)")
    args = ap.parse_args()

    import transformers
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    dev = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    cfg = DeepseekV4Config(**peer_config(args.layers, args.tiny))
    cfg._attn_implementation = "eager"
    t0 = time.perf_counter()
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg).to(torch.bfloat16).eval()
    gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"peer: transformers {transformers.__version__} eager DeepseekV4ForCausalLM, {args.layers} layers "
          f"{list(cfg.layer_types)}, hidden {cfg.hidden_size}, bf16 random, {gb:.1f} GB on {name}, built in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    for b in (int(v) for v in args.batches.split(",")):
        prompt = torch.randint(2, cfg.vocab_size, (b, args.ctx), device=dev, generator=g)
        out = model(prompt, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        pos = [args.ctx]

        def step():  # one decode token per row, the cache growing as in generation
            model(nxt, past_key_values=cache, use_cache=True,
                  position_ids=torch.full((b, 1), pos[0], device=dev))
            pos[0] += 1

        ms = timed(step, dev, args.reps)
        print(f"peer decode B={b} ctx={args.ctx}: {ms:.2f} ms/step, {ms / args.layers:.2f} ms per layer "
              f"(head included), 43 layers ≈ {ms / args.layers * 43:.0f} ms/token", flush=True)
        del out, cache
    if args.prefill:
        ids = torch.randint(2, cfg.vocab_size, (1, args.prefill), device=dev, generator=g)
        ms = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), dev, max(1, args.reps // 2))
        print(f"peer prefill {args.prefill}: {ms:.1f} ms, {args.prefill / ms * 1e3:.0f} tok/s for {args.layers} "
              f"layers, 43 layers ≈ {args.prefill / (ms * 43 / args.layers) * 1e3:.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
