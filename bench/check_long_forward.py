"""One long forward against the same prompt in engine-sized chunks: whether the Triton kernels' row offsets hold
at T tokens in one forward (a 32-bit element offset past 2^31 reads or writes the wrong memory). Flash- or
Pro-shaped layers, random weights, the engine's paged FP8 pools. Prints, for the last row of every chunk, the
largest difference of the final hidden states relative to their largest magnitude, and whether the greedy
picks agree. The first chunk's end sees the same tokens either way, so its difference is the noise floor (bf16
roundings of other kernel shapes, grown through random layers); a wrapped offset shows as rows far above it or
as a fault. A check run on the GPU, not a benchmark.

    python bench/check_long_forward.py --tokens 65536 [--model pro] [--layers 4] [--chunk 8192]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--model", choices=["flash", "pro"], default="flash")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--chunk", type=int, default=8192)
    args = p.parse_args()
    from bench_parallel import Runner, _config
    from dsv4.engine.cache import CacheConfig, HybridCache
    from dsv4.model import DeepseekV4ForCausalLM
    cfg = _config(os.path.join(os.path.dirname(__file__), "configs", f"deepseek-v4-{args.model}.config.json"),
                  args.layers)
    dev = torch.device("cuda")
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg, torch.bfloat16, kernels="triton")
    model.load_random_weights(seed=1)
    ctx = args.tokens + 64
    cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=2, max_model_len=ctx, total_tokens=2 * ctx,
                                                      kv_dtype="fp8"), dtype=torch.bfloat16, device=dev)
    run = Runner(model, cfg.vocab_size, dev, cache)
    ids = run.ids(args.tokens)
    ends = torch.arange(args.chunk, args.tokens + args.chunk, args.chunk, device=dev).clamp(max=args.tokens) - 1
    whole_state, chunked_state = run.new_states(2)
    whole = run.hidden([whole_state], [args.tokens], ids)[ends].float()
    torch.cuda.synchronize()
    parts = [run.hidden([chunked_state], [min(args.chunk, args.tokens - s)], ids[s:s + args.chunk])[-1:]
             for s in range(0, args.tokens, args.chunk)]
    chunked = torch.cat(parts).float()
    scale = chunked.abs().amax(dim=1)
    rel = ((whole - chunked).abs().amax(dim=1) / scale).tolist()
    same = (model.compute_logits(whole.bfloat16()).argmax(-1) == model.compute_logits(chunked.bfloat16()).argmax(-1))
    print(f"{args.model} {args.layers} layers, {args.tokens} tokens in one forward vs chunks of {args.chunk}: "
          f"finite {bool(torch.isfinite(whole).all())}, max relative difference per chunk end "
          f"{' '.join(f'{r:.1e}' for r in rel)}, greedy picks equal {same.sum().item()}/{same.numel()}")


if __name__ == "__main__":
    main()
