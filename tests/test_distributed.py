"""Tensor- and expert-parallel runs (gloo, CPU) against one process.

A tiny quantised checkpoint (FP8 linears, MXFP4 experts) with every attention kind (sliding, CSA,
HCA) and both routings (layers 0-1 hash-routed, 2-3 top-k) is loaded by one process and by two
ranks in five layouts: TP2, EP2, TP2+EP2, each EP layout with both MoE combines. Every rank must
give the single-process logits (a prefill, then decode steps with the carried state, and the MTP
block) to 1e-5 relative (float32 computes in float64, so expect exact), the same greedy tokens from
the lock-stepped engines, hold only its shard, and read only its own experts from the checkpoint. A Pro-shaped
checkpoint runs the TP2 + EP2 all-to-all layout the same way.
"""
from __future__ import annotations

import os
import re

import pytest
import torch
import torch.multiprocessing as mp

from dsv4.checkpoint.writer import pro_shaped_config, random_master_weights, tiny_config, write_checkpoint
from dsv4.distributed.sharding import Cut, Layout, take, take_fp8_pair

TOL = 1e-5
CFG = tiny_config("fp4", "sliding,csa,hca,csa", num_hash_layers=2, moe_intermediate_size=256)
# V4-Pro's shape with three hash layers and experts 6 x 128 wide (a TP2 half of the shared expert: 3 FP8 blocks)
CFG_PRO = pro_shaped_config(num_hash_layers=3, moe_intermediate_size=768)
LENGTH = 140        # > 128: the HCA layer completes an entry; > 4 * index_topk: CSA really selects
CHUNKS = [132, 3, 1, 1, 1, 2]   # prefill, then decode steps of the same sequence (sums to LENGTH)
PROMPTS = [[5, 17, 300, 41, 8, 99, 250], [7, 7, 1, 400, 23]]
MAX_TOKENS = 4
SPEC_TOKENS = 10
LAYOUTS_2 = [(2, 1, "allreduce"), (1, 2, "allreduce"), (2, 2, "allreduce"), (1, 2, "alltoall"),
             (2, 2, "alltoall")]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def _ids() -> torch.Tensor:
    return torch.randint(2, CFG.vocab_size, (LENGTH,), generator=torch.Generator().manual_seed(5))


def run_model(model) -> dict[str, torch.Tensor]:
    """Logits of a prefill and decode steps of one sequence, and of the MTP block on the prefill."""
    from dsv4.model import ForwardContext, set_forward_context
    ids = _ids()
    state, parts, start = model.new_sequence_state(), [], 0
    with torch.no_grad():
        for n in CHUNKS:
            with set_forward_context(ForwardContext([n], [state])):
                parts.append(model.compute_logits(model(ids[start:start + n], torch.arange(start, start + n))))
            if start == 0:
                residual = model.get_mtp_target_hidden_states()
            start += n
        _, hidden = model.forward_mtp(residual[:-1], ids[1:CHUNKS[0]], torch.arange(CHUNKS[0] - 1))
        return {"logits": torch.cat(parts), "mtp": model.mtp[0].compute_logits(hidden)}


def make_engine(model, speculative: bool = False, overlap: bool | None = None):
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    return LLMEngine(model, model.config, None, EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
        speculative="mtp" if speculative else None, num_draft_tokens=2, overlap=overlap))


def greedy(core, params=None) -> dict[str, list[int]]:
    from dsv4.engine.sampling_params import SamplingParams
    params = params or SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens = {}
    for i, p in enumerate(PROMPTS):
        core.add_request(f"r{i}", p, params)
        tokens[f"r{i}"] = []
    while core.has_unfinished():
        for out in core.step():
            tokens[out.request_id] += out.token_ids
    return tokens


def speculative_runs(model, run=lambda engine, lead: lead(engine), rank: int = 0) -> dict:
    """MTP speculative decoding (2 drafts per step): greedy, and unseeded sampling from torch's global
    generator, seeded per rank so that only rank 0's draws can match one process's; `run` drives an
    engine (lock-stepped across ranks, or directly in one process)."""
    from dsv4.engine.sampling_params import SamplingParams
    out = {}
    for key, params in (("spec_greedy", SamplingParams(temperature=0.0, max_tokens=SPEC_TOKENS, ignore_eos=True)),
                        ("spec_sampled", SamplingParams(temperature=0.9, max_tokens=SPEC_TOKENS, ignore_eos=True))):
        engine = make_engine(model, speculative=True)
        torch.manual_seed(1000 + rank)
        out[key] = run(engine, lambda core: greedy(core, params))
        out[key + "_drafted"] = engine.speculator.stats.num_draft_tokens
    return out


def sampled_run(model, run=lambda engine, lead: lead(engine), rank: int = 0) -> dict:
    """Unseeded sampling without speculation, so through the engine's look-ahead (ids picked on the device; rank
    0's broadcast to the others), from torch's global generator seeded per rank: only rank 0's draws count."""
    from dsv4.engine.sampling_params import SamplingParams
    engine = make_engine(model, overlap=True)  # on the CPU only when asked for
    launched = []
    inner = engine.scheduler.schedule_continuation
    engine.scheduler.schedule_continuation = lambda rows: launched.append(inner(rows)) or launched[-1]
    torch.manual_seed(2000 + rank)
    params = SamplingParams(temperature=0.9, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {"sampled": run(engine, lambda core: greedy(core, params)),
            "sampled_ahead": sum(b is not None for b in launched)}


def _rank_main(rank: int, world: int, port: int, ckpt: str, outdir: str, layouts) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from dsv4.checkpoint.loader import Checkpoint
    from dsv4.distributed import ParallelConfig, init_parallel
    from dsv4.distributed.engine import lockstep
    from dsv4.model.load import load_model

    dist.init_process_group("gloo", rank=rank, world_size=world)
    read: list[str] = []  # tensors handed out for loading (validation reads only headers and scales)
    original = Checkpoint.iter_tensors

    def recording(self, filter=None):
        for name, tensor in original(self, filter):
            read.append(name)
            yield name, tensor
    Checkpoint.iter_tensors = recording
    results = []
    for tp, ep, comm in layouts:
        ps = init_parallel(ParallelConfig(tp, ep, comm))
        read.clear()
        model = load_model(ckpt, parallel=ps)
        res = run_model(model)
        res["read"] = list(read)
        res["shapes"] = {n: tuple(p.shape) for n, p in model.named_parameters()}
        for key, graphs in (("greedy", False), ("greedy_graphs", True)):
            if graphs:  # the paged steps through the graph code, run eagerly (`capture=False`), every rank
                model.enable_cuda_graphs(max_batch=4, capture=False)
            res[key] = lockstep(make_engine(model), ps, greedy)
        res["graph_steps"] = len(model._graphs._steps)
        res["prefill_pieces"] = len(model._graphs._prefill)
        model._graphs = None
        if (tp, ep) == (2, 2):  # rank 0 drafts and judges; the other rank follows its decisions
            import dsv4.engine.spec_decode as spec
            real = spec.first_argmax
            if rank:  # the other rank's own greedy picks are wrong: only rank 0's (broadcast) may count
                spec.first_argmax = lambda x: (real(x) + 1) % x.shape[-1]
            res.update(speculative_runs(model, lambda engine, lead: lockstep(engine, ps, lead), rank))
            spec.first_argmax = real
            res.update(sampled_run(model, lambda engine, lead: lockstep(engine, ps, lead), rank))
        results.append(res)
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def spawn(world: int, ckpt, tmp_path, layouts) -> list[list[dict]]:
    from dsv4.distributed.launcher import free_port
    mp.spawn(_rank_main, args=(world, free_port(), str(ckpt), str(tmp_path), layouts), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt"), CFG, random_master_weights(CFG, seed=11))


@pytest.fixture(scope="module")
def reference(checkpoint):
    return _reference(checkpoint)


def _reference(checkpoint) -> dict:
    from dsv4.model.load import load_model
    model = load_model(checkpoint)
    out = run_model(model)
    out["greedy"] = greedy(make_engine(model))
    out.update(speculative_runs(model))
    out.update(sampled_run(model))
    return out


def check_rank(res: dict, ref: dict, layout: tuple, rank: int, cfg=CFG) -> None:
    tp, ep, comm = layout
    what = f"rank {rank} tp={tp} ep={ep} {comm}"
    for key in ("logits", "mtp"):
        assert res[key].shape == ref[key].shape, what
        assert rel(res[key], ref[key]) <= TOL, f"{what} {key}: rel {rel(res[key], ref[key]):.2e}"
    if rank == 0:
        assert res["greedy"] == ref["greedy"], what
        assert res["greedy_graphs"] == ref["greedy"], f"{what}: graph plumbing"
    assert res["graph_steps"] > 0, f"{what}: no decode step went through the graph code"
    assert res["prefill_pieces"] > 0, f"{what}: no prefill went through the pieces"
    if (tp, ep) == (2, 2):
        assert res["spec_greedy_drafted"] > 0 and res["spec_sampled_drafted"] > 0, what
        assert res["sampled_ahead"] > 0 and ref["sampled_ahead"] > 0, f"{what}: no look-ahead"
        if rank == 0:
            assert res["spec_greedy"] == ref["spec_greedy"], f"{what}: speculative greedy"
            assert res["spec_sampled"] == ref["spec_sampled"], f"{what}: speculative sampling"
            assert res["sampled"] == ref["sampled"], f"{what}: sampling with the look-ahead"
    # this rank's shard only
    c, shapes = cfg, res["shapes"]
    per = c.n_routed_experts // ep
    mine = range((rank % ep) * per, (rank % ep + 1) * per)
    held = {int(n.split(".")[4]) for n in shapes if n.startswith("layers.2.ffn.experts.")}
    assert held == set(mine), what
    assert shapes["layers.1.attn.wq_b.weight"] == (c.num_heads // tp * c.head_dim, c.q_lora_rank), what
    assert shapes["layers.1.attn.wo_b.weight"] == (c.hidden_size, c.o_groups // tp * c.o_lora_rank), what
    assert shapes["head.weight"] == (c.vocab_size // tp, c.hidden_size), what
    assert shapes["mtp.0.ffn.shared_experts.w2.weight"] == (c.hidden_size, c.moe_intermediate_size // tp), what
    # the checkpoint reader never touched another rank's experts
    experts_read = {int(n.split(".")[4]) for n in res["read"] if ".ffn.experts." in n}
    assert experts_read == set(mine), what


def test_two_ranks_match_one_process(checkpoint, reference, tmp_path):
    assert len(set(map(tuple, reference["greedy"].values()))) == 2  # the prompts continue differently
    results = spawn(2, checkpoint, tmp_path, LAYOUTS_2)
    for rank, per_rank in enumerate(results):
        for layout, res in zip(LAYOUTS_2, per_rank):
            check_rank(res, reference, layout, rank)


def test_two_ranks_pro_shaped_model(tmp_path_factory, tmp_path):
    """TP2 + EP2 (all-to-all combine) on a Pro-shaped checkpoint against one process."""
    assert CFG_PRO.vocab_size == CFG.vocab_size  # run_model's prompt ids are drawn for CFG's vocabulary
    ckpt = write_checkpoint(tmp_path_factory.mktemp("pro"), CFG_PRO, random_master_weights(CFG_PRO, seed=12))
    ref = _reference(ckpt)
    layout = (2, 2, "alltoall")
    for rank, per_rank in enumerate(spawn(2, ckpt, tmp_path, [layout])):
        check_rank(per_rank[0], ref, layout, rank, CFG_PRO)


@pytest.mark.slow
def test_four_ranks_tp2_ep4(checkpoint, reference, tmp_path):
    """Two TP groups of two (attention computed twice), experts over all four ranks."""
    layouts = [(2, 4, "allreduce"), (2, 4, "alltoall")]
    results = spawn(4, checkpoint, tmp_path, layouts)
    for rank, per_rank in enumerate(results):
        for layout, res in zip(layouts, per_rank):
            check_rank(res, reference, layout, rank)


# ---- layout arithmetic and slicing (no processes) ---------------------------------------------

def test_layout_rejects_what_cannot_be_split():
    with pytest.raises(ValueError, match="num_attention_heads"):
        Layout(CFG, 8, 1, 0)            # 4 heads
    with pytest.raises(ValueError, match="n_routed_experts"):
        Layout(CFG, 1, 3, 0)            # 8 experts
    from dsv4.distributed import ParallelConfig
    with pytest.raises(ValueError, match="divide"):
        ParallelConfig(2, 3)
    small = tiny_config("fp4")           # moe_intermediate_size 128: I/2 would cut an FP8 block
    layout = Layout(small, 2, 1, 1)
    assert not layout.shared_split and layout.cut("layers.0.ffn.shared_experts.w1.weight") is None
    assert layout.cut("layers.0.attn.wo_b.weight") == Cut(1, 128, 128)


def test_cutting_a_quantised_pair_equals_cutting_the_dequantised_weight():
    from dsv4.quant.fp8 import dequantize_fp8_block, quantize_fp8_block
    g = torch.Generator().manual_seed(3)
    w = torch.randn(384, 256, generator=g) * torch.rand(384, 1, generator=g)
    wq, s = quantize_fp8_block(w)
    full = dequantize_fp8_block(wq, s)
    for cut in (Cut(0, 128, 256), Cut(1, 128, 128), Cut(0, 256, 128)):
        part_q, part_s = take_fp8_pair("w", wq, s, cut)
        assert torch.equal(dequantize_fp8_block(part_q, part_s), take("w", full, cut))
    with pytest.raises(ValueError, match="tiles"):
        take_fp8_pair("w", wq, s, Cut(0, 64, 128))


def test_cli_spawns_ranks_and_matches_one_process_generate():
    """`--tp 2 --ep 2` on the embedded model: two ranks started by the CLI, only rank 0 prints, and
    the greedy text equals a single-process LLM's, also with MTP speculative decoding, and with a regex grammar
    (each rank's matcher follows the tokens rank 0 picks) under MTP."""
    import subprocess
    import sys

    from dsv4.engine.llm import LLM
    from dsv4.engine.sampling_params import SamplingParams
    from dsv4.engine.structured import StructuredOutput
    prompts = ["The following methods can be defined to", "If the exception"]
    llm, regex = LLM(None, device="cpu"), "[0-9]{2}-[a-z]{2,3}"
    want = [r.text for r in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8))]
    constrained = [r.text for r in llm.generate(prompts, SamplingParams(
        temperature=0.0, max_tokens=8, structured=StructuredOutput(regex=regex)))]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    mtp = ["--speculative", "mtp", "--num-draft-tokens", "2"]
    # greedy: drafts change no token
    for extra, texts in (([], want), (mtp, want), (mtp + ["--regex", regex], constrained)):
        run = subprocess.run([sys.executable, "-m", "dsv4.distributed.cli", "generate", *prompts, "--tp", "2",
                              "--ep", "2", "--device", "cpu", "--max-tokens", "8", "--no-stream", *extra],
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout == "".join(t + "\n" for t in texts), extra
    assert any(w.strip() for w in want) and all(re.fullmatch(regex, t) for t in constrained), constrained


def test_bench_runs_on_two_ranks_and_reports_json():
    """`dsv4 bench --tp 2 --ep 2` (ranks spawned by the CLI): one JSON report from rank 0 with the
    layout, every request run to its length (steps = 1 prefill + output_len - 1 decode steps)."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, "-m", "dsv4", "bench", "--tp", "2", "--ep", "2", "--device", "cpu",
                          "--batch", "3", "--prompt-len", "16", "--output-len", "5"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert (result["tp"], result["ep"], result["batch"], result["steps"]) == (2, 2, 3, 5)
    assert result["decode_tok_per_s"] > 0 and result["prefill_tok_per_s"] > 0
    bad = subprocess.run([sys.executable, "-m", "dsv4", "bench", "--tp", "2", "--device", "cpu", "--cuda-graphs"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--cuda-graphs needs CUDA" in bad.stderr and "Traceback" not in bad.stderr
