"""Kernel mode's stacked FP8 linears of one input (CPU side): wq_a | wkv and wq_b | indexer.wq_b as one
GEMM over row-stacked weights (`Attention.fuse_fp8_pairs`, dsv4.model.linear.stack_fp8_linears).

The Triton kernels need CUDA (tests/gpu/test_fused_fp8_linears_gpu.py); here `fp8_linear` and the other
kernel entry points are swapped for their torch references, which every caller looks up at call time,
so the fused and the separate paths run the same function. Checked: the stacked outputs are bit for bit
the separate linears' (and within a bf16 rounding of a float64 re-derivation), prepare's q/kv/index_q
and whole-model logits are unchanged by the fusion, reloads write through, replaced weights fall back,
non-FP8 models are untouched, TP ranks stack their own slices.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import dsv4.model.deepseek_v4 as dv
from dsv4.checkpoint.writer import random_master_weights, tiny_config
from dsv4.kernels.fp8_linear import LinearConfig, fp8_linear_ref
from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16_ref
from dsv4.kernels.norm_rope import norm_rope_ref, norm_rope_two_ref
from dsv4.kernels.swiglu import swiglu_ref
from dsv4.model import ForwardContext, set_forward_context
from dsv4.model.attention import Attention
from dsv4.model.linear import _stacked_launch, quantized_weights
from dsv4.model.moe import MoE
from dsv4.model.numerics import resolve_numerics
from dsv4.quant.fp8 import dequantize_fp8_block, fake_quant_fp8, quantize_fp8_block

BF16, F64 = torch.bfloat16, torch.float64
# the modules (dsv4.kernels re-exports functions under their submodules' names)
fp8_mod = importlib.import_module("dsv4.kernels.fp8_linear")
calls: list[tuple[int, int, LinearConfig | None]] = []  # (weight address, rows, config) of each fp8_linear call


@pytest.fixture
def torch_kernels(monkeypatch):
    """The Triton entry points replaced by their references (the kernel-mode code paths stay)."""
    calls.clear()

    def fp8_linear(x, w, s, config=None, out_dtype=BF16):
        calls.append((w.data_ptr(), w.shape[0], config))
        return fp8_linear_ref(x, w, s, out_dtype)

    monkeypatch.setattr(fp8_mod, "fp8_linear", fp8_linear)
    monkeypatch.setattr(importlib.import_module("dsv4.kernels.norm_rope"), "norm_rope", norm_rope_ref)
    monkeypatch.setattr(importlib.import_module("dsv4.kernels.norm_rope"), "norm_rope_two", norm_rope_two_ref)
    monkeypatch.setattr(importlib.import_module("dsv4.kernels.swiglu"), "swiglu", swiglu_ref)
    monkeypatch.setattr(importlib.import_module("dsv4.kernels.grouped_w8a16"), "grouped_linear_w8a16",
                        lambda x, w, s, config=None: grouped_linear_w8a16_ref(x, w, s))


def _master(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Rows of different magnitudes per 128-row block: distinct scales on both sides of every seam."""
    mag = torch.exp2(torch.randint(-3, 3, (n // 128, 1), generator=g).float()).repeat_interleave(128, 0)
    return torch.randn(n, k, generator=g) * k ** -0.5 * mag


def _layer(kind: str, seed: int) -> tuple[Attention, torch.Generator]:
    """A kernel-mode layer (FP8 linears kept quantised) with every tensor random."""
    cfg = tiny_config("fp8", kind)
    with quantized_weights("fp8"):
        attn = Attention(cfg, cfg.layer(0), BF16, resolve_numerics("reference"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in attn.named_modules():
            if getattr(mod, "kernel_format", None) is not None:
                mod.load_master(f"{name}.weight", _master(*mod.weight.shape, g))
        for name, p in attn.named_parameters():
            if p.dtype != torch.float8_e4m3fn:
                scale = 1.0 if p.dim() == 1 or name.endswith("ape") else p.shape[-1] ** -0.5
                p.copy_((torch.randn(p.shape, generator=g) * scale).to(p.dtype))
    return attn, g


def _input(rows: int, k: int, g: torch.Generator) -> torch.Tensor:
    mag = torch.exp2(torch.randint(-4, 4, (rows, k // 128), generator=g).float()).repeat_interleave(128, 1)
    return (torch.randn(rows, k, generator=g) * mag).to(BF16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _f64(lin, x: torch.Tensor) -> torch.Tensor:
    """Spec re-derivation: per-128 FP8 activation times the dequantised block weight, in float64."""
    return fake_quant_fp8(x.float(), 128).to(F64) @ dequantize_fp8_block(lin.weight, lin.scale, F64).T


def test_stack_is_exact_and_aliases_the_linears():
    attn, g = _layer("csa", seed=1)
    before = {n: (l.weight.clone(), l.scale.clone()) for n, l in
              (("wq_a", attn.wq_a), ("wkv", attn.wkv), ("wq_b", attn.wq_b), ("iwq_b", attn.indexer.wq_b))}
    attn.fuse_fp8_pairs()
    for name, parts in (("a", ["wq_a", "wkv"]), ("q_latent", ["wq_b", "iwq_b"])):
        stack = attn._fp8_stacks[name]
        assert torch.equal(stack.weight.view(torch.uint8), torch.cat([before[p][0] for p in parts]).view(torch.uint8))
        assert torch.equal(stack.scale, torch.cat([before[p][1] for p in parts]))
        row = 0
        for lin in stack.linears:  # no second copy: each linear's weight and scale are its rows
            assert lin.weight.data_ptr() == stack.weight[row].data_ptr()
            assert lin.scale.data_ptr() == stack.scale[row // 128].data_ptr()
            row += lin.weight.shape[0]
    assert "wq_a.weight" in dict(attn.named_parameters()) and "wkv.scale" in dict(attn.named_buffers())
    kept = attn._fp8_stacks["a"]
    attn.fuse_fp8_pairs()  # a second finalize keeps an intact stack
    assert attn._fp8_stacks["a"] is kept
    # a reload after fusing (load_master/load_quantized copy in place) writes through into the stack
    new = _master(*attn.wkv.weight.shape, g)
    attn.wkv.load_master("wkv.weight", new)
    q, s = quantize_fp8_block(new, scale_dtype="float32")
    n = attn.wq_a.weight.shape[0]
    assert torch.equal(kept.weight[n:].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(kept.scale[n // 128:], s)
    assert torch.equal(kept.weight[:n].view(torch.uint8), before["wq_a"][0].view(torch.uint8))


def test_sliding_layer_stacks_wq_a_wkv_only():
    attn, _ = _layer("sliding", seed=2)
    attn.fuse_fp8_pairs()
    assert list(attn._fp8_stacks) == ["a"] and attn.indexer is None


@pytest.mark.parametrize("name", ["a", "q_latent"])
def test_stacked_outputs_are_the_separate_linears_bits(torch_kernels, name):
    attn, g = _layer("csa", seed=3)
    lins = attn.fp8_pairs()[name]
    x = _input(1, lins[0].weight.shape[1], g)
    separate = [lin(x, input_ready=True) for lin in lins]
    attn.fuse_fp8_pairs()
    calls.clear()
    fused = attn._fp8_pair(name, x)
    stack = attn._fp8_stacks[name]
    assert [c[:2] for c in calls] == [(stack.weight.data_ptr(), stack.weight.shape[0])]  # one GEMM over the stack
    assert all(f.untyped_storage().data_ptr() == fused[0].untyped_storage().data_ptr() for f in fused)
    for lin, f, s in zip(lins, fused, separate):
        assert _same(f, s)
        want = _f64(lin, x).to(BF16)  # fp32 sums of exact products: one bf16 rounding flip at most
        steps = (_bits(f).int() - _bits(want).int()).abs()
        assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) < 0.02
    # more rows: each linear runs alone (column slices would cost norm_rope a copy each), same bits
    x3 = _input(3, x.shape[1], g)
    calls.clear()
    assert all(_same(f, lin(x3, input_ready=True)) for f, lin in zip(attn._fp8_pair(name, x3), lins))
    assert [c[1] for c in calls] == [lin.weight.shape[0] for lin in lins] * 2


def test_replaced_weight_falls_back_until_restacked(torch_kernels):
    attn, g = _layer("csa", seed=4)
    attn.fuse_fp8_pairs()
    old = attn._fp8_stacks["a"]
    x = _input(1, attn.wq_a.weight.shape[1], g)
    # a new Parameter (as a conversion makes): the stack no longer holds wkv's values
    w = attn.wkv.weight
    attn.wkv.weight = nn.Parameter(quantize_fp8_block(_master(*w.shape, g), scale_dtype="float32")[0],
                                   requires_grad=False)
    calls.clear()
    got = attn._fp8_pair("a", x)
    assert len(calls) == 2 and _same(got[1], attn.wkv(x, input_ready=True))
    attn.fuse_fp8_pairs()  # the next finalize stacks the new weight
    new = attn._fp8_stacks["a"]
    assert new is not old and torch.equal(new.weight[attn.wq_a.weight.shape[0]:].view(torch.uint8),
                                          attn.wkv.weight.view(torch.uint8))
    calls.clear()
    assert _same(attn._fp8_pair("a", x)[1], attn.wkv(x, input_ready=True)) and len(calls) == 2
    attn._apply(lambda t: t.clone())  # module conversions drop the stacks
    assert attn._fp8_stacks == {}


def test_kernel_mode_prepare_unchanged_by_fusion(torch_kernels):
    attn, g = _layer("csa", seed=5)
    attn.use_kernels = attn.indexer.use_kernels = True
    a = _input(1, attn.wq_a.weight.shape[1], g)
    positions = torch.tensor([int(torch.randint(0, 70000, (1,), generator=g))])
    ref = attn.prepare(a, positions)
    attn.fuse_fp8_pairs()
    calls.clear()
    got = attn.prepare(a, positions)
    assert len(calls) == 2  # wq_a|wkv and wq_b|indexer.wq_b: one launch each
    for field in ("q", "kv", "index_q", "index_w"):
        assert _same(getattr(got, field), getattr(ref, field)), field
    assert got.q.shape == (1, attn.n_heads, attn.head_dim) and got.index_q.shape[1:] == (16, 128)


@pytest.fixture
def no_gemv(monkeypatch):
    """One-row linears on the tensor-core GEMM (as with `linear_config.GEMV = False`)."""
    monkeypatch.setattr(importlib.import_module("dsv4.kernels.linear_config"), "GEMV", False)
    _stacked_launch.cache_clear()
    yield
    _stacked_launch.cache_clear()


def test_stacked_launch_config_matches_each_part(no_gemv):
    """Decode sizes split K by the number of output tiles; one launch is exact only where the parts split
    alike. Expected splits worked out by hand from the documented rule: the largest power of two with
    tiles * split <= 2 * 132 SMs and >= 4 (m <= 16) or >= 8 (16 < m <= 64) K/128 blocks per split, where
    m <= 16 tiles are 128 weight rows and 16 < m <= 64 tiles 64."""
    flash_a = _stacked_launch(1, (1024, 512), 4096)  # 8 and 4 tiles, 32 K blocks: split 8 (16 leaves 2)
    assert flash_a is not None and flash_a.split_k == 8 and flash_a.swap_ab
    assert _stacked_launch(1, (32768, 8192), 1024) is None  # 256 tiles -> 1, 64 tiles -> 2
    assert _stacked_launch(1, (8192, 8192), 1024).split_k == 2  # TP=4 shard: 64 tiles each
    assert _stacked_launch(1, (512, 2048), 128).split_k == 1  # one K block cannot split
    assert _stacked_launch(32, (32768, 8192), 1024).split_k == 1  # 512 and 128 tiles of 64 rows, 8 K blocks
    flash_64 = _stacked_launch(64, (1024, 512), 4096)  # 16 and 8 tiles of 64 rows: 4 (8 would leave 4 blocks)
    assert flash_64.split_k == 4 and flash_64.bn == 64 and flash_64.bm == 64
    assert _stacked_launch(128, (4096, 4096), 4096).split_k == 2  # 2 x 32 tiles of 64x128, one wave: 2
    from dsv4.kernels.fp8_linear import CUBLAS_MIN_ROWS
    assert _stacked_launch(CUBLAS_MIN_ROWS - 1, (1024, 512), 4096) is not None
    assert _stacked_launch(CUBLAS_MIN_ROWS, (1024, 512), 4096) is None  # cuBLAS parts: separate launches


def test_stacked_one_row_launch_is_the_gemv_of_each_part():
    """One row: the CUDA-core GEMV (`pick_gemv_config`): below 2^24 weight bytes 64 rows x 4 K blocks per step
    (32 x 8 where K is 8 blocks), from there 16 x 4, none (tensor-core GEMM) from 2^25 FP8 bytes; split: the
    largest power of two with tiles * split <= 1024 and whole steps per split; none either where the grid holds
    less than min(weight, 4 MiB) in flight (programs x rows x K blocks per step x 128 bytes). Worked out by hand."""
    from dsv4.kernels.linear_config import GemvConfig, LinearConfig, pick_gemv_config
    _stacked_launch.cache_clear()
    assert _stacked_launch(1, (1024, 512), 4096) == GemvConfig(64, 4, 8)  # 16 and 8 tiles, 32 K blocks
    assert _stacked_launch(1, (8192, 8192), 1024) == GemvConfig(32, 8, 1)  # 256 tiles, one step of 8
    assert _stacked_launch(1, (512, 2048), 128) == GemvConfig(64, 1, 1)  # one K block
    assert _stacked_launch(1, (32768, 8192), 1024) is None  # wq_b (2^25 bytes) on the GEMM, idx_wq_b the GEMV
    assert _stacked_launch(1, (4096, 1024), 4096) is None  # 2^24 bytes: 16-row programs vs 64
    assert _stacked_launch(2, (1024, 512), 4096).split_k == 8  # two rows: the tensor-core GEMM
    # Pro's K = 7168 (56 blocks) splits in two: wq_a 24 tiles x 2 x 32 KB = 1.5 MiB < 4, wkv 0.5 MiB < 3.5: the GEMM
    assert pick_gemv_config(1, 1536, 7168) is None and pick_gemv_config(1, 512, 7168) is None
    assert isinstance(_stacked_launch(1, (1536, 512), 7168), LinearConfig)
    # ... while 64-row programs of a 12-block K (Pro idx_wq_b, 8192 x 1536) hold 128 x 32 KB = 4 MiB: the GEMV
    assert pick_gemv_config(1, 8192, 1536) == GemvConfig(64, 4, 1)
    assert pick_gemv_config(1, 512, 1024) == GemvConfig(32, 8, 1)  # 16 x 32 KB = the whole 0.5 MiB weight


# --------------------------------------------------------------------------- whole models


@pytest.fixture
def kernel_mode(monkeypatch):
    monkeypatch.setattr(dv, "resolve_kernels", lambda kernels, dtype, device: "triton")


def _model(cfg, masters, parallel=None, numerics="reference", kernels="triton", dtype=BF16):
    m = dv.DeepseekV4ForCausalLM(cfg, dtype, numerics=numerics, parallel=parallel, kernels=kernels)
    m.load_weights(masters.items())
    m.load_mtp_weights(masters.items())
    m.finalize_weights()
    return m


def _logits(model, prompt: torch.Tensor, steps: list[int]) -> torch.Tensor:
    state, out, pos = model.new_sequence_state(), [], 0
    with torch.no_grad():
        for ids in [prompt] + [torch.tensor([t]) for t in steps]:
            with set_forward_context(ForwardContext([ids.numel()], [state])):
                out.append(model.compute_logits(model(ids, torch.arange(pos, pos + ids.numel()))))
            pos += ids.numel()
    return torch.cat(out)


def test_whole_model_logits_unchanged_by_fusion(kernel_mode, torch_kernels, monkeypatch):
    """Kernel mode on the CPU: routed experts left unpacked (their FP8 linears run through the swapped
    fp8_linear), mHC through torch; prefill then single-token decode with and without the stacks."""
    monkeypatch.setattr(MoE, "pack_experts", lambda self: self.shared_experts.fuse_w13())
    cfg = tiny_config("fp8", "sliding,csa,hca")
    model = _model(cfg, random_master_weights(cfg, seed=6))
    for b in list(model.layers) + list(model.mtp):
        assert set(b.attn._fp8_stacks) == ({"a", "q_latent"} if b.attn.indexer else {"a"})
        b.mhc = None
    model._head_mix = None
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(2, cfg.vocab_size, (5,), generator=g)
    steps = torch.randint(2, cfg.vocab_size, (3,), generator=g).tolist()
    calls.clear()
    fused = _logits(model, prompt, steps)
    stacked = {(s.weight.data_ptr(), s.weight.shape[0]) for b in model.layers for s in b.attn._fp8_stacks.values()}
    assert sum(c[:2] in stacked for c in calls) == 3 * 4  # decode only: 3 steps x (3 + 1 CSA) stacks
    for b in model.layers:
        b.attn._fp8_stacks.clear()  # the separate linears (still the same row views)
    separate = _logits(model, prompt, steps)
    assert torch.isfinite(fused).all() and fused.std() > 0
    assert torch.equal(fused, separate)


def test_model_reload_writes_through_the_stacks(kernel_mode):
    cfg = tiny_config("fp8", "csa")
    model = _model(cfg, random_master_weights(cfg, seed=8))
    attn = model.layers[0].attn
    kept = dict(attn._fp8_stacks)
    masters = random_master_weights(cfg, seed=9)  # the attention's tensors again (packed experts stay)
    model.load_weights((n, t) for n, t in masters.items() if n.startswith("layers.0.attn."))
    model.finalize_weights()
    assert attn._fp8_stacks == kept and all(s.intact() for s in kept.values())
    fresh = _model(cfg, masters).layers[0].attn  # the new masters loaded into a new model
    for name, parts in (("a", ["wq_a", "wkv"]), ("q_latent", ["wq_b", "indexer.wq_b"])):
        want = [fresh.get_submodule(p) for p in parts]
        assert torch.equal(kept[name].weight.view(torch.uint8), torch.cat([l.weight for l in want]).view(torch.uint8))
        assert torch.equal(kept[name].scale, torch.cat([l.scale for l in want]))


@pytest.mark.parametrize("how", ["torch float64", "kernels without FP8 activations"])
def test_models_without_fp8_kernel_linears_are_untouched(monkeypatch, how):
    cfg = tiny_config("fp8", "csa")
    masters = random_master_weights(cfg, seed=10, include_mtp=False)
    if how == "torch float64":
        model = _model(cfg, masters, kernels="torch", dtype=F64)
    else:  # numerics="transformers": no FP8 activations, so the linears keep bf16 weights
        monkeypatch.setattr(dv, "resolve_kernels", lambda kernels, dtype, device: "triton")
        model = _model(cfg, masters, numerics="transformers")
        assert model.layers[0].attn.use_kernels
    attn = model.layers[0].attn
    assert attn._fp8_stacks == {}
    for lin in (attn.wq_a, attn.wkv, attn.wq_b, attn.indexer.wq_b):
        assert lin.kernel_format is None and lin.weight._base is None  # not a view of anything


def test_tp_rank_stacks_its_wq_b_heads_over_the_whole_indexer(kernel_mode):
    cfg = tiny_config("fp8", "csa,hca")
    masters = random_master_weights(cfg, seed=11)
    whole = _model(cfg, masters)
    for rank in range(2):
        part = _model(cfg, masters, parallel=SimpleNamespace(tp=2, ep=1, rank=rank))
        for wb, pb in zip(list(whole.layers) + list(whole.mtp), list(part.layers) + list(part.mtp)):
            w, p = wb.attn, pb.attn
            assert torch.equal(p._fp8_stacks["a"].weight.view(torch.uint8), w._fp8_stacks["a"].weight.view(torch.uint8))
            if w.indexer is None:
                assert "q_latent" not in p._fp8_stacks
                continue
            h = w.wq_b.weight.shape[0] // 2  # this rank's heads of wq_b, then all of the indexer's
            sw, ss = p._fp8_stacks["q_latent"].weight.view(torch.uint8), p._fp8_stacks["q_latent"].scale
            assert sw.shape[0] == h + w.indexer.wq_b.weight.shape[0]
            assert torch.equal(sw[:h], w.wq_b.weight[rank * h:(rank + 1) * h].view(torch.uint8))
            assert torch.equal(sw[h:], w.indexer.wq_b.weight.view(torch.uint8))
            assert torch.equal(ss[:h // 128], w.wq_b.scale[rank * h // 128:(rank + 1) * h // 128])
            assert p.wq_b.weight.data_ptr() == p._fp8_stacks["q_latent"].weight.data_ptr()
