"""Time one MoE layer under both expert combines (`allreduce`, `alltoall`), decode and prefill sizes.

    python -m dsv4.distributed.bench_moe --world 2                       # CPU, gloo, small shapes
    python -m dsv4.distributed.bench_moe --world 2 --device cuda --flash # NCCL, Flash's MoE shape

Each rank builds the same random MoE layer (tp = ep = world, so experts are split by expert and the
shared expert by TP), routes the same random tokens, and times `forward` per token count for each
combine; rank 0 prints the median milliseconds and checks that both combines agree.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def _config(args):
    from dsv4.checkpoint.writer import tiny_config
    if args.flash:
        return tiny_config("fp4", "csa", hidden_size=4096, n_routed_experts=256, moe_intermediate_size=2048,
                           num_experts_per_tok=6, num_attention_heads=64, o_groups=8, num_hash_layers=0)
    return tiny_config("fp4", "csa", hidden_size=args.hidden, n_routed_experts=args.experts,
                       moe_intermediate_size=args.inter, num_experts_per_tok=args.topk, num_hash_layers=0)


def _layer(cfg, ps, dtype, device):
    from dsv4.distributed.sharding import Layout
    from dsv4.model.moe import MoE
    from dsv4.model.numerics import resolve_numerics
    with torch.device(device):
        moe = MoE(cfg, cfg.layer(0), dtype, resolve_numerics("reference"), Layout.of(cfg, ps))
    # One seed, parameters in module order: the router is the same on every rank (the same routing);
    # the expert slices get arbitrary but fixed values (timing only needs consistent shapes).
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            full = torch.randn(p.shape, generator=g, device=device) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.01)
            p.copy_(full.to(p.dtype))
    return moe.eval()


def _time(fn, reps: int, device) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench(args, ps) -> list[tuple[int, str, float]]:
    dtype = torch.float32 if ps.device.type == "cpu" else torch.bfloat16
    cfg = _config(args)
    moe = _layer(cfg, ps, dtype, ps.device)
    rows = []
    for t in args.tokens:
        g = torch.Generator().manual_seed(t)
        x = torch.randn(t, cfg.hidden_size, generator=g).to(ps.device, dtype)
        outs = {}
        for comm in ("allreduce", "alltoall"):
            ps.moe_comm = comm
            with torch.no_grad():
                outs[comm] = moe(x, None)
                ms = _time(lambda: moe(x, None), args.reps, ps.device)
            rows.append((t, comm, ms))
        if ps.is_first:
            a, b = outs["allreduce"].double(), outs["alltoall"].double()
            assert (a - b).abs().max() <= 1e-2 * a.abs().max(), f"combines disagree at T={t}"
    return rows


def _main(rank: int, args) -> None:
    from dsv4.distributed import launcher
    from dsv4.distributed.parallel_state import destroy_parallel
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    torch.set_num_threads(args.threads)
    ps = launcher.init_from_env(device=args.device)
    try:
        rows = bench(args, ps)
        if ps.is_first:
            print(f"MoE layer, world {ps.world_size} ({ps.device.type}), median ms over {args.reps} runs")
            print(f"{'tokens':>8} {'allreduce':>10} {'alltoall':>10}")
            for t in args.tokens:
                got = {c: ms for tt, c, ms in rows if tt == t}
                print(f"{t:>8} {got['allreduce']:>10.2f} {got['alltoall']:>10.2f}", flush=True)
    finally:
        destroy_parallel()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--flash", action="store_true", help="Flash's MoE shape (D 4096, 256 x 2048 experts, top-6)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--inter", type=int, default=256)
    p.add_argument("--topk", type=int, default=6)
    p.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8, 64, 1024])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from dsv4.distributed.launcher import run_ranks
    run_ranks(_main, args, args.world)


if __name__ == "__main__":
    main()
