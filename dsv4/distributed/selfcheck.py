"""Check a multi-process setup: sharded tiny models against one process, on this machine's devices.

    python -m dsv4.distributed.selfcheck --world 2 [--device cuda] [--dtype float32|bfloat16] [--kernels triton]

Rank 0 also builds the whole model; every layout (TP, EP, TP+EP, both MoE combines) must reproduce
its logits for a 140-token prefill and four decode steps (every attention kind, hash and top-k
routing). Prints the max relative error per layout; float32 models compute in float64 and should
print 0 or ~1e-7 (a float64 summation-order difference surfacing in one fp32 rounding). With
`--checkpoint DIR` checks a real checkpoint instead (e.g. the embedded trained model
dsv4/assets/tiny): in bfloat16 the sharded sums differ from one process in fp32 summation order,
which a random tiny model amplifies chaotically (FP8 re-quantisation and top-k flips; ~0.3 max rel on
CPU even without kernels), so bf16 runs should be judged on a trained model: the logits' relative RMS
difference and whether the greedy continuation (also printed) is the same. With `--kernels triton`
(bf16 on CUDA) both sides run the Triton kernels.
"""
from __future__ import annotations

import argparse
import os

import torch


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    from dsv4.model import ForwardContext, set_forward_context
    state, out, start = model.new_sequence_state(), [], 0
    with torch.no_grad():
        for n in (ids.numel() - 4, 1, 1, 1, 1):
            with set_forward_context(ForwardContext([n], [state])):
                pos = torch.arange(start, start + n, device=ids.device)
                out.append(model.compute_logits(model(ids[start:start + n], pos)))
            start += n
    return torch.cat(out).double()


def _greedy(model, ids: torch.Tensor, steps: int) -> list[int]:
    from dsv4.model import ForwardContext, set_forward_context
    state, out, nxt, start = model.new_sequence_state(), [], ids, 0
    with torch.no_grad():
        for _ in range(steps):
            with set_forward_context(ForwardContext([nxt.numel()], [state])):
                pos = torch.arange(start, start + nxt.numel(), device=ids.device)
                tok = model.compute_logits(model(nxt, pos)[-1:]).argmax(-1)
            start += nxt.numel()
            out.append(int(tok))
            nxt = tok
    return out


def _main(rank: int, args) -> None:
    from dsv4.checkpoint.writer import random_master_weights, tiny_config
    from dsv4.distributed import ParallelConfig, destroy_parallel, init_parallel, launcher
    from dsv4.model import DeepseekV4ForCausalLM

    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    ps0 = launcher.init_from_env(device=args.device)  # world-sized groups; layouts below re-group
    dtype = getattr(torch, args.dtype)
    if args.checkpoint:
        from dsv4.config import ModelConfig
        from dsv4.model import load_model
        cfg = ModelConfig.from_file(os.path.join(args.checkpoint, "config.json"))

        def build(parallel):
            return load_model(args.checkpoint, ps0.device, dtype, parallel=parallel, kernels=args.kernels)
    else:
        cfg = tiny_config("fp4", "sliding,csa,hca,csa", num_hash_layers=2, moe_intermediate_size=256)
        masters = random_master_weights(cfg, seed=1)

        def build(parallel):
            with torch.device(ps0.device):
                m = DeepseekV4ForCausalLM(cfg, dtype, parallel=parallel, kernels=args.kernels)
            m.load_weights(masters.items())
            m.finalize_weights()
            return m
    ids = torch.randint(2, cfg.vocab_size, (140,), generator=torch.Generator().manual_seed(2)).to(ps0.device)

    def run(model):
        return _logits(model, ids), _greedy(model, ids, args.greedy)

    ref, ref_text = run(build(None)) if ps0.is_first else (None, None)
    w = ps0.world_size
    layouts = [(w, 1, "allreduce"), (1, w, "allreduce"), (w, w, "allreduce"), (1, w, "alltoall"),
               (w, w, "alltoall")]
    try:
        for tp, ep, comm in layouts:
            if cfg.num_heads % tp or cfg.o_groups % tp:
                continue
            ps = init_parallel(ParallelConfig(tp, ep, comm), ps0.device)
            got, text = run(build(ps))
            if ps.is_first:
                err = float((got - ref).abs().max() / ref.abs().max())
                rms = float((got - ref).norm() / ref.norm())
                same = sum(a == b for a, b in zip(text, ref_text))
                first = next((i for i, (a, b) in enumerate(zip(text, ref_text)) if a != b), None)
                print(f"tp={tp} ep={ep} {comm:9s} {args.dtype} kernels={args.kernels}: max rel error {err:.3e}, "
                      f"rel RMS {rms:.3e}, greedy {same}/{len(ref_text)} tokens equal"
                      f"{'' if first is None else f' (first differs at {first})'}", flush=True)
    finally:
        destroy_parallel()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--kernels", default="torch", choices=("torch", "triton"))
    p.add_argument("--checkpoint", default=None, help="a checkpoint directory instead of a random tiny model")
    p.add_argument("--greedy", type=int, default=24, help="greedy tokens compared after the prompt")
    args = p.parse_args(argv)
    from dsv4.distributed.launcher import run_ranks
    run_ranks(_main, args, args.world)


if __name__ == "__main__":
    main()
