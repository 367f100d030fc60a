"""Decode under CUDA graphs across TP/EP ranks (NCCL / symmetric-memory collectives captured inside the
paged whole-step graphs, dsv4.model.graphs): the lock-stepped engines' greedy tokens must equal the same
ranks' eager kernel-mode decode, also with MTP speculative decoding (rank 0 drafts and judges). Needs two
GPUs (device kind nvidia-h200-x2); skipped otherwise."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA devices (run through the device tool, nvidia-h200-x2)")

PROMPTS = [[5, 17, 300, 41, 8, 99, 250, 3, 77], [7, 7, 1, 400, 23], [9, 1000, 12]]
MAX_TOKENS = 24
HANG_DUMP_S = int(os.environ.get("DSV4_TEST_HANG_S", "400"))  # per rank process (kernel compilation included)


def _greedy(core) -> dict[str, list[int]]:
    from dsv4.engine.sampling_params import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {f"r{i}": [] for i in range(len(PROMPTS))}
    for i, p in enumerate(PROMPTS):
        core.add_request(f"r{i}", p, params)
    while core.has_unfinished():
        for o in core.step():
            out[o.request_id] += o.token_ids
    return out


def _rank_main(rank: int, world: int, port: int, ckpt: str, outdir: str, layout) -> None:
    import faulthandler
    import sys
    import time
    # a hung collective fails the test with every thread's stack instead of stalling the run
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)
    t0 = time.perf_counter()

    def phase(what: str) -> None:
        print(f"[rank {rank} {layout}] {what} at {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    import torch.distributed as dist

    from dsv4.distributed import ParallelConfig, init_parallel
    from dsv4.distributed.engine import lockstep
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.model.load import load_model

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    ps = init_parallel(ParallelConfig(*layout))
    res = {}
    # the engine's look-ahead is on (a CUDA model; rank 0's ids broadcast on the device) except in "graphs_sync"
    runs = [("eager", False, False), ("graphs", True, False), ("graphs_sync", True, False)]
    if layout[:2] == (2, 2):  # MTP speculation (2 drafts; rank 0 decides), its draft and verify steps graphed
        runs += [("spec_eager", False, True), ("spec_graphs", True, True)]
    for key, graphs, spec in runs:
        phase(f"{key}: loading")
        model = load_model(ckpt, ps.device, torch.bfloat16, parallel=ps, kernels="triton", include_mtp=spec)
        config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256, kv_dtype="fp8",
                              speculative="mtp" if spec else None, num_draft_tokens=2, overlap=key != "graphs_sync")
        if graphs:
            model.enable_cuda_graphs(max_batch=config.decode_step_rows)
        phase(f"{key}: decoding")
        engine = LLMEngine(model, model.config, None, config)
        res[key] = lockstep(engine, ps, _greedy)
        if spec:
            res[key + "_drafted"] = engine.speculator.stats.num_draft_tokens
        if graphs:
            res[key + "_captured"] = sum(1 for b in model._graphs._steps.values() if b.graphs)
            res[key + "_prefill_captured"] = sum(1 for b in model._graphs._prefill.values() if b.graphs)
        phase(f"{key}: done")
    torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", [(2, 2, "allreduce"), (2, 1, "allreduce"), (1, 2, "allreduce")])
def test_graphed_decode_over_two_ranks_matches_eager(layout, tmp_path):
    from dsv4.distributed.launcher import free_port

    import dsv4
    ckpt = Path(dsv4.__file__).parent / "assets" / "tiny"
    mp.spawn(_rank_main, args=(2, free_port(), str(ckpt), str(tmp_path), layout), nprocs=2)
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(r["graphs_captured"] > 0 for r in res), "no decode step was captured"
    assert all(r["graphs_prefill_captured"] > 0 for r in res), "no prefill ran as captured pieces (session 60)"
    assert res[0]["graphs"] == res[0]["eager"], layout
    assert res[0]["graphs_sync"] == res[0]["graphs"], f"{layout}: with vs without the look-ahead"
    if layout[:2] == (2, 2):
        assert all(r["spec_graphs_captured"] > 0 and r["spec_eager_drafted"] > 0 for r in res)
        assert res[0]["spec_graphs"] == res[0]["spec_eager"], "speculative: graphs vs eager"
    assert len({tuple(t) for t in res[0]["eager"].values()}) > 1  # the prompts continue differently
