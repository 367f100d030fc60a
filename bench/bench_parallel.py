"""Full-size DeepSeek-V4 model over W GPUs (TP/EP on NCCL), random weights made on the GPUs.

    python bench/bench_parallel.py --config bench/configs/deepseek-v4-flash.config.json --world 2 \
        [--tp 2 --ep 2] [--layers N] [--batches 1,8,16,64] [--ctx 1024] [--prefill 8192] [--json OUT]

Every rank builds `DeepseekV4ForCausalLM` with its shard (`parallel=`, kernel mode: FP8 linears and
the fused MXFP4 MoE of dsv4.kernels, everything else the torch reference path), fills it with
`load_random_weights` (no disk), and runs on the engine's paged pools (`--kv-dtype fp8|auto`) or on
contiguous per-sequence state (`--kv-dtype contiguous`):

* prefill: one `--prefill`-token prompt in one forward (TTFT of that prompt, tokens/s);
* decode: for each batch size B, B sequences prefilled with `--ctx` tokens, then the median
  milliseconds of one decode step (1 token per sequence, logits, greedy pick), one MTP draft step,
  chained decode steps fed their own picks with the host's read-back before / after the next launch,
  and one verify step (2 tokens per sequence, the target's work with one MTP draft);
* ceilings measured in the same run: device-to-device copy bandwidth per GPU, NCCL all-reduce
  latency (one decode-sized bf16 row block) and bandwidth (256 MiB).

The decode roofline is the bytes one step must read on the busiest rank (this rank's weights except
the embedding, the routed experts a uniform router touches on average, the KV state read) over the
measured copy bandwidth. Rank 0 prints a table and writes the numbers as JSON.

`--device cpu` (gloo, the torch reference path, small sizes) only checks the script itself, e.g. with
a tiny config written by `dsv4 make-tiny`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _config(path: str, layers: int | None):
    from dsv4.config import ModelConfig
    with open(path) as f:
        d = json.load(f)
    if layers is not None and layers < d["num_hidden_layers"]:
        ratios = d["compress_ratios"]
        d["compress_ratios"] = ratios[:layers] + ratios[d["num_hidden_layers"]:]
        d["num_hidden_layers"] = layers
        d["num_hash_layers"] = min(d.get("num_hash_layers", 0), layers)
    return ModelConfig.from_dict(d)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


def _median_ms(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _copy_bandwidth(dev) -> float:
    a = torch.empty(2 << 30 if dev.type == "cuda" else 64 << 20, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    ms = _median_ms(lambda: b.copy_(a), 10)
    return 2 * a.numel() / (ms * 1e-3)  # read + write


def _allreduce(dev, numel: int, dtype, iters: int = 50, reduce=None, graph: bool = False) -> float:
    """Milliseconds per all-reduce (NCCL, or `reduce`), from back-to-back calls (the sync/barrier around
    them amortised), eager or replayed as one CUDA graph. The sums grow without bound (timing only)."""
    t = torch.randn(numel, device=dev).to(dtype)
    reduce = reduce or dist.all_reduce

    def loop():
        for _ in range(iters):
            reduce(t)
    if graph:
        from dsv4.model.graphs import _capture
        return _median_ms(_capture([loop], sharded=True)[0].replay, 5, warmup=1) / iters
    return _median_ms(loop, 5, warmup=1) / iters


def _count_launches(model, step) -> int:
    """GPU kernels one decode step launches when run eagerly (graphs off for the count)."""
    from torch.profiler import ProfilerActivity, profile
    graphs, model._graphs = model._graphs, None
    try:
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
    finally:
        model._graphs = graphs
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _replay_ms(model, reps: int) -> float:
    """GPU time of the last decode step's graph alone, replayed back to back (the step minus the host's
    work around it: filling the tables, the LM head, argmax, the read-back)."""
    bucket = model._graphs._last
    if not getattr(bucket, "graphs", None):
        return 0.0
    g = bucket.graphs[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


class Runner:
    """Drives the model: prefill, decode, MTP and verify steps, on the engine's paged pools (`cache`,
    a HybridCache: decode steps take the fixed-shape path) or on contiguous states (cache None).

    A step never makes the host wait for the GPU here (only the timing harness does): random ids are
    drawn on the device, positions and row indices go over in pinned memory without a wait, and the
    context says the inputs are ours (`trusted_inputs`: the model reads no device tensor back to check
    them; the MTP block still checks its ids, dsv4/model/mtp.py)."""

    def __init__(self, model, vocab: int, dev, cache=None):
        self.model, self.vocab, self.dev, self.cache = model, vocab, dev, cache
        self.gen = torch.Generator(device=dev).manual_seed(7)  # same ids on every rank
        self._seqs: dict[int, object] = {}
        self._count = 0

    def new_states(self, n: int) -> list:
        if self.cache is None:
            return [self.model.new_sequence_state() for _ in range(n)]
        from dsv4.engine.sequence import Sequence
        out = []
        for _ in range(n):
            self._count += 1
            seq = Sequence(f"bench{self._count}", [1])
            state = self.cache.state_of(seq)
            self._seqs[id(state)] = seq
            out.append(state)
        return out

    def release(self, states) -> None:
        for s in states:
            seq = self._seqs.pop(id(s), None)
            if seq is not None:
                self.cache.block_manager.free(seq)
                self.cache.release(seq)

    def ids(self, n: int) -> torch.Tensor:
        return torch.randint(2, self.vocab, (n,), generator=self.gen, device=self.dev)

    def _positions(self, starts: list[int], lens: list[int]) -> torch.Tensor:
        """Positions start..start+n-1 of every sequence, on the device (one copy, not waited for)."""
        from dsv4.model.context import to_device
        flat = [t + j for t, n in zip(starts, lens) for j in range(n)]
        return to_device(torch.tensor(flat, dtype=torch.long), self.dev)

    def hidden(self, states, lens, ids=None) -> torch.Tensor:
        """The final hidden states [sum(lens), D] of `lens` more tokens (random ids unless given) of each state."""
        from dsv4.model import ForwardContext, set_forward_context
        if self.cache is not None:
            for s, n in zip(states, lens):
                self.cache.reserve(self._seqs[id(s)], n)
        pos = self._positions([s.num_tokens for s in states], lens)
        ids = self.ids(sum(lens)) if ids is None else ids
        with torch.no_grad(), set_forward_context(ForwardContext(lens, states, trusted_inputs=True)):
            return self.model(ids, pos)

    def forward(self, states, lens, ids=None):
        from dsv4.engine.sampler import first_argmax
        from dsv4.model.context import to_device
        hidden = self.hidden(states, lens, ids)
        with torch.no_grad():
            if any(n != 1 for n in lens):  # the last row of every sequence
                ends = torch.tensor(lens, dtype=torch.long).cumsum(0) - 1
                hidden = hidden[to_device(ends, self.dev)]
            return first_argmax(self.model.compute_logits(hidden))

    def decode_chain(self, states, steps: int, pipelined: bool) -> float:
        """ms per decode step over `steps` steps, each fed the previous step's picks on the device. Sync: the
        host reads a step's picks back before it launches the next (today's engine). Pipelined: after it has
        launched the next, so the host's work for step k + 1 overlaps the GPU's step k (an engine that
        schedules one step ahead); the GPU is then never idle while the host is faster than the step."""
        one = [1] * len(states)
        ids, prev = self.ids(len(states)), None
        _sync()
        t = time.perf_counter()
        for _ in range(steps):
            ids = self.forward(states, one, ids)
            if not pipelined:
                ids.tolist()
            elif prev is not None:
                prev.tolist()
            prev = ids
        prev.tolist()
        _sync()
        return (time.perf_counter() - t) * 1e3 / steps

    def mtp(self, states, lens):
        from dsv4.engine.sampler import first_argmax
        from dsv4.model import ForwardContext, set_forward_context
        pos = self._positions([s.mtp.num_tokens for s in states], lens)
        width = self.model.config.hc_mult * self.model.config.hidden_size
        res = torch.randn(pos.numel(), width, device=self.dev).to(torch.bfloat16)
        with torch.no_grad(), set_forward_context(ForwardContext(lens, states, trusted_inputs=True)):
            _, hidden = self.model.forward_mtp(res, self.ids(pos.numel()), pos)
            return first_argmax(self.model.mtp[0].compute_logits(hidden))

    def prefill(self, states, ctx: int, chunk: int = 8192, with_mtp: bool = True) -> None:
        """`ctx` tokens into every state, at most `chunk` tokens per forward (long prompts in pieces)."""
        per = max(1, chunk // ctx)
        for i in range(0, len(states), per):
            group = states[i:i + per]
            for done in range(0, ctx, chunk):
                n = min(chunk, ctx - done)
                self.forward(group, [n] * len(group))
                if with_mtp:
                    self.mtp(group, [n] * len(group))


def _host_profile(step, steps: int, say) -> None:
    """Where a decode step's host time goes: cProfile over `steps` steps, each read back before the next (the
    engine's order), summed up as bench_engine_step.py does for the engine's steps."""
    import cProfile
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_engine_step import _host_share
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    wait_ms, top = _host_share(prof, steps, 18)
    say(f"host profile of {steps} decode steps: {wait_ms:.2f} ms per step waiting for the GPU "
        f"(tottime = own time, cumtime = with callees)\n{top}")


def _decode_roof_bytes(model, batch: int, ctx: int) -> int:
    """Bytes one decode step reads on this rank (see the module docstring)."""
    from dsv4.model.moe import MoE
    c = model.config
    total = 0
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if name.startswith(("embed.", "mtp.")) or ".tid2eid" in name:
            continue
        total += p.numel() * p.element_size()
    for m in model.layers.modules():
        if isinstance(m, MoE) and m.packed is not None:
            pk = m.packed
            per_expert = sum(t.numel() * t.element_size() for t in (pk.w13, pk.w13_scale, pk.w2, pk.w2_scale)) \
                // pk.num_experts
            share = pk.num_experts / c.n_routed_experts
            touched = c.n_routed_experts * (1 - (1 - c.num_experts_per_tok / c.n_routed_experts) ** batch)
            total += int(per_expert * touched * share)
    entry = c.head_dim * 2  # bf16 contiguous state
    kv = 0
    for spec in c.layers:
        kv += min(ctx, c.window) * entry
        if spec.compress_ratio == 4:
            kv += min(ctx // 4, c.index_topk) * entry + (ctx // 4) * c.index_head_dim * 2
        elif spec.compress_ratio:
            kv += (ctx // spec.compress_ratio) * entry
    return total + batch * kv


def _rank_main(rank: int, args) -> None:
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    from dsv4.distributed import launcher
    from dsv4.model import DeepseekV4ForCausalLM

    ps = launcher.init_from_env(args.tp, args.ep, device=args.device)
    dev = ps.device
    gpu = dev.type == "cuda"
    first = ps.is_first
    say = (lambda *a: print(*a, flush=True)) if first else (lambda *a: None)
    out: dict = {"world": ps.world_size, "tp": ps.tp, "ep": ps.ep, "cuda_graphs": args.cuda_graphs,
                 "gpu": torch.cuda.get_device_name(dev) if gpu else "cpu"}

    out["copy_GBps"] = _copy_bandwidth(dev) / 1e9
    if ps.world_size > 1:
        out["allreduce_row_us"] = 1e3 * _allreduce(dev, args.ceiling_rows * 4096, torch.bfloat16)
        if gpu:  # what a graphed decode step pays: one fp32 row of partial sums, NCCL vs the fast path
            row = args.ceiling_rows * 4096
            out["allreduce_row_f32_graph_us"] = 1e3 * _allreduce(dev, row, torch.float32, graph=True)
            if ps.tp_fast is not None:
                out["fast_allreduce_row_f32_graph_us"] = 1e3 * _allreduce(dev, row, torch.float32,
                                                                          reduce=ps.tp_fast, graph=True)
        n = 128 << 20 if gpu else 1 << 20
        ms = _allreduce(dev, n, torch.bfloat16, iters=5)
        out["allreduce_busbw_GBps"] = 2 * (ps.world_size - 1) / ps.world_size * (2 * n) / (ms * 1e-3) / 1e9
    say(f"ceilings: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()})}")

    cfg = _config(args.config, args.layers)
    t0 = time.perf_counter()
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg, torch.bfloat16, parallel=ps if ps.world_size > 1 else None,
                                      kernels="triton" if gpu else "torch")
    model.load_random_weights(seed=1)
    model.eval()
    if args.cuda_graphs:
        model.enable_cuda_graphs(max_batch=2 * max(args.batches))  # the verify step: 2 tokens per sequence
    _sync()
    out["layers"] = cfg.num_layers
    out["build_s"] = time.perf_counter() - t0
    out["weights_GB_per_gpu"] = torch.cuda.memory_allocated(dev) / 1e9 if gpu else 0.0
    say(f"model: {cfg.num_layers} layers, built+filled in {out['build_s']:.1f} s, "
        f"{out['weights_GB_per_gpu']:.1f} GB on GPU {ps.rank}")

    cache = None
    if args.kv_dtype != "contiguous":
        from dsv4.engine.cache import CacheConfig, HybridCache
        steps = 4 * args.reps + 64  # decode/verify tokens a sequence gains at one batch size, with margin
        longest = max(args.ctx + steps, args.prefill + steps)
        cache_cfg = CacheConfig.for_capacity(cfg, max_num_seqs=max(args.batches) + 3, max_model_len=longest,
                                             total_tokens=max(args.batches) * (args.ctx + steps) + longest + 600,
                                             kv_dtype=args.kv_dtype)
        cache = HybridCache(cfg, cache_cfg, dtype=model.dtype, device=dev)
    out["state"] = args.kv_dtype
    run = Runner(model, cfg.vocab_size, dev, cache)
    # warm-up: compile the Triton kernels for the token counts used below
    warm = run.new_states(2)
    run.prefill(warm, 300)
    for lens in ([1, 1], [2, 2]):
        run.forward(warm, lens)
    run.mtp(warm, [1, 1])
    run.release(warm)

    if args.prefill:
        chunks = [int(c) for c in args.prefill_chunks.split(",")] if args.prefill_chunks else [args.prefill]
        times = {c: [] for c in chunks}
        for rep in range(args.prefill_reps + 1):  # rep 0 compiles the kernels of the prompt's shapes: not timed
            for i, chunk in enumerate(chunks):  # chunk sizes alternate within a rep
                st = run.new_states(1)
                _sync()
                t = time.perf_counter()
                for done in range(0, args.prefill, chunk):  # as the engine's token budget per step splits it
                    run.forward(st, [min(chunk, args.prefill - done)])
                _sync()
                if rep:
                    times[chunk].append(time.perf_counter() - t)
                if rep < args.prefill_reps or i < len(chunks) - 1:  # the last state serves the decode below
                    run.release(st)
        for chunk in chunks[1:]:
            cms = 1e3 * statistics.median(times[chunk])
            out.setdefault("prefill_chunked", []).append({"chunk": chunk, "ms": cms})
            say(f"prefill {args.prefill} tokens in {chunk}-token forwards: {cms:.0f} ms = "
                f"{args.prefill / cms * 1e3:.0f} tok/s")
        ms = 1e3 * statistics.median(times[chunks[0]])
        # decode right after that prompt; 8 warm-up steps: at ctx 8192 the 4th closes CSA entry 2049, and the
        # radix top-k's block (next power of two) compiles for 4096 (it made this figure 0.9-1.3 s, session 10)
        dec = _median_ms(lambda: run.forward(st, [1]), args.reps, warmup=8)
        out["prefill"] = {"tokens": args.prefill, "ms": ms, "tok_per_s": args.prefill / ms * 1e3,
                          "decode_ms_after": dec}
        how = "graphs" if gpu and args.cuda_graphs else "eager: host-bound, ~3 ms per layer"
        say(f"prefill {args.prefill} tokens: {ms:.0f} ms = {args.prefill / ms * 1e3:.0f} tok/s (TTFT); "
            f"then decode B=1 at ctx {args.prefill} ({how}): {dec:.1f} ms/step")
        run.release(st)

    out["decode"] = []
    for b in args.batches:
        states = run.new_states(b)
        run.prefill(states, args.ctx)
        one, two = [1] * b, [2] * b
        dec = _median_ms(lambda: run.forward(states, one), args.reps)
        replay = _replay_ms(model, args.reps) if gpu and args.cuda_graphs else 0.0
        mtp = _median_ms(lambda: run.mtp(states, one), args.reps)
        ver = _median_ms(lambda: run.forward(states, two), max(3, args.reps // 2))
        chain = {p: run.decode_chain(states, 2 * args.reps, p) for p in (False, True)}
        launches = _count_launches(model, lambda: run.forward(states, one)) if gpu else 0
        roof_bytes = _decode_roof_bytes(model, b, args.ctx)
        roof = torch.tensor([roof_bytes], dtype=torch.float64, device=dev)
        if dist.is_initialized():
            dist.all_reduce(roof, op=dist.ReduceOp.MAX)
        roof_ms = float(roof) / (out["copy_GBps"] * 1e9) * 1e3
        row = {"batch": b, "ctx": args.ctx, "decode_ms": dec, "mtp_ms": mtp, "verify2_ms": ver, "replay_ms": replay,
               "chain_sync_ms": chain[False], "chain_pipelined_ms": chain[True], "launches": launches,
               "tok_per_s": b / dec * 1e3, "roof_ms": roof_ms, "roof_x": dec / roof_ms}
        out["decode"].append(row)
        say(f"B={b:3d} ctx={args.ctx}: decode {dec:8.1f} ms/step ({b / dec * 1e3:7.1f} tok/s), "
            f"(graph replay {replay:.2f}), MTP draft {mtp:6.1f} ms, verify(2 tok) {ver:8.1f} ms, "
            f"roofline {roof_ms:.2f} ms ({dec / roof_ms:.0f}x), "
            f"{launches} kernels/step eager")
        say(f"B={b:3d} ctx={args.ctx}: chained decode (ids from the last picks) {chain[False]:.2f} ms/step with the "
            f"read-back before the next launch, {chain[True]:.2f} pipelined (read back after it)")
        if args.host_profile and first:
            _host_profile(lambda: run.forward(states, one).tolist(), args.host_profile, say)
        run.release(states)
        if gpu:
            torch.cuda.empty_cache()

    out["peak_GB_per_gpu"] = torch.cuda.max_memory_allocated(dev) / 1e9 if gpu else 0.0
    if first and args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    _sync()
    from dsv4.distributed import destroy_parallel
    destroy_parallel()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "configs",
                                                    "deepseek-v4-flash.config.json"))
    p.add_argument("--world", type=int, default=2, help="GPUs (ignored under torchrun)")
    p.add_argument("--tp", type=int, default=None)
    p.add_argument("--ep", type=int, default=None)
    p.add_argument("--layers", type=int, default=None, help="keep the first N layers (default: all)")
    p.add_argument("--batches", default="1,8,16,64")
    p.add_argument("--ctx", type=int, default=1024, help="context of each decoding sequence")
    p.add_argument("--prefill", type=int, default=8192)
    p.add_argument("--prefill-reps", type=int, default=2)
    p.add_argument("--prefill-chunks", default=None, help="comma-separated tokens per forward for the prompt, "
                   "timed alternately (the first is the one reported as TTFT; default: the whole prompt at once)")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--ceiling-rows", type=int, default=1, help="rows of the all-reduce latency probe")
    p.add_argument("--json", default=None)
    p.add_argument("--host-profile", type=int, default=0, metavar="STEPS",
                   help="also profile the host over STEPS decode steps of each batch (cProfile, rank 0)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--cuda-graphs", action="store_true",
                   help="decode through CUDA graphs (sharded: not yet GPU-run, see run_device_s15b_x2.sh)")
    p.add_argument("--kv-dtype", default="fp8", choices=("fp8", "auto", "contiguous"),
                   help="paged pools with FP8 (default) or model-dtype KV, or the contiguous per-sequence state")
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b]
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_parallel needs CUDA GPUs (or --device cpu for a smoke run)")
    from dsv4.distributed.launcher import run_ranks
    run_ranks(_rank_main, args, args.world)


if __name__ == "__main__":
    main()
