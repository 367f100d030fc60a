"""Random weights made in place (`load_random_weights`, full-size benchmarks) and the expert-parallel
conventions of the MoE kernel references (ids of other ranks' experts are skipped)."""
from __future__ import annotations

import math

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, set_forward_context
from dsv4.model.linear import EXPERT, FP8, Linear, quantized_weights
from dsv4.model.numerics import resolve_numerics
from dsv4.model.synthetic import fill_random_weights  # noqa: F401  (the module under test)


def _logits(model, ids):
    state = model.new_sequence_state()
    with torch.no_grad(), set_forward_context(ForwardContext([ids.numel()], [state])):
        return model.compute_logits(model(ids, torch.arange(ids.numel())))


def test_random_model_is_finite_deterministic_and_seeded():
    cfg = tiny_config("fp4", "sliding,csa,hca", num_hash_layers=1)
    ids = torch.randint(2, cfg.vocab_size, (70,))
    models = []
    for seed in (5, 5, 6):
        m = DeepseekV4ForCausalLM(cfg, torch.float32)
        m.load_random_weights(seed)
        models.append(m)
    a, b, c = (_logits(m, ids) for m in models)
    assert torch.isfinite(a).all() and 0.1 < float(a.std()) < 10
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert models[0].mtp[0].ready  # the MTP block is filled too
    tid = models[0].layers[0].ffn.gate.tid2eid
    assert all(len(set(row.tolist())) == tid.shape[1] for row in tid[:50])  # distinct experts per token


@pytest.mark.parametrize("expert_dtype,fmt", [("fp4", EXPERT), ("fp4", FP8), ("fp8", EXPERT)])
def test_quantized_fill_has_master_magnitude(expert_dtype, fmt):
    """Kernel-mode linears get codes + block scales whose dequantised rows have std ~ 1/sqrt(in)."""
    from dsv4.model.synthetic import _fill_quantized
    from dsv4.quant.fp8 import dequantize_fp8_block
    from dsv4.quant.mxfp4 import dequantize_mxfp4

    with quantized_weights(expert_dtype):
        lin = Linear(1024, 256, torch.bfloat16, resolve_numerics("reference"), fmt)
    assert lin.kernel_format == ("mxfp4" if (expert_dtype, fmt) == ("fp4", EXPERT) else "fp8")
    g = torch.Generator().manual_seed(3)
    _fill_quantized(lin, "weight", lin.weight, g)
    _fill_quantized(lin, "scale", lin.scale, g)
    if lin.kernel_format == "mxfp4":
        w = dequantize_mxfp4(lin.weight, lin.scale, dtype=torch.float32)
    else:
        w = dequantize_fp8_block(lin.weight, lin.scale, torch.float32)
    ratio = float(w.std()) * math.sqrt(1024)
    assert 2 ** -0.5 < ratio < 2 ** 0.5, ratio  # one power-of-two rounding of the scale at most


@pytest.mark.parametrize("expert_dtype", ["fp4", "fp8"])
def test_wo_a_keeps_fp8_weight_in_kernel_mode(expert_dtype):
    """An FP8 linear without activation quantisation (wo_a) keeps its e4m3 weight for the grouped
    W8A16 kernel; its scales come back as E8M0 bytes when all are powers of two, else as float32,
    and the cached conversion follows an in-place reload of the scales."""
    from dsv4.model.synthetic import _fill_quantized
    from dsv4.quant.e8m0 import e8m0_to_float

    with quantized_weights(expert_dtype):
        lin = Linear(1024, 256, torch.bfloat16, resolve_numerics("reference"), FP8, quantize_input=False)
    assert lin.kernel_format == "w8a16" and lin.weight.dtype == torch.float8_e4m3fn
    g = torch.Generator().manual_seed(5)
    _fill_quantized(lin, "weight", lin.weight, g)
    with torch.no_grad():
        lin.scale.copy_(torch.exp2(torch.randint(-20, 3, lin.scale.shape, generator=g).float()))
    e8 = lin.e8m0_scale()
    assert e8.dtype == torch.uint8 and torch.equal(e8m0_to_float(e8), lin.scale)
    assert lin.e8m0_scale() is e8  # cached
    with torch.no_grad():
        lin.scale.mul_(1.5)  # no longer powers of two: the float32 scales themselves
    assert lin.e8m0_scale().dtype == torch.float32 and torch.equal(lin.e8m0_scale(), lin.scale)
    with pytest.raises(RuntimeError, match="w8a16"):
        lin(torch.randn(2, 1024, dtype=torch.bfloat16))


def test_moe_align_ref_skips_foreign_ids():
    from dsv4.kernels.moe_align import moe_align_ref

    gen = torch.Generator().manual_seed(4)
    e, k, bm, m = 6, 3, 4, 25
    ids = torch.randint(-1, 2 * e, (m, k), generator=gen)  # -1 and ids >= e belong elsewhere
    sorted_ids, expert_ids, num_post = moe_align_ref(ids, e, bm)
    # independent construction: per expert, its pairs in ascending order, padded to bm with m*k
    flat = ids.reshape(-1).tolist()
    want_sorted, want_blocks = [], []
    for ex in range(e):
        pairs = [p for p, v in enumerate(flat) if v == ex]
        padded = pairs + [m * k] * (-len(pairs) % bm)
        want_sorted += padded
        want_blocks += [ex] * (len(padded) // bm)
    assert int(num_post) == len(want_sorted)
    assert sorted_ids[: len(want_sorted)].tolist() == want_sorted
    assert bool((sorted_ids[len(want_sorted):] == m * k).all())
    assert expert_ids[: len(want_blocks)].tolist() == want_blocks
    assert bool((expert_ids[len(want_blocks):] == -1).all())


def test_fused_moe_ref_partials_add_up():
    """Each 'rank' computing its experts (others -1) in fp32: the partials sum to the whole."""
    from dsv4.kernels.moe import ExpertWeights, fused_moe_ref

    gen = torch.Generator().manual_seed(8)
    e, d, i, m, k = 4, 256, 128, 9, 2

    def packed(n, kk):
        return torch.randint(-128, 128, (e, n, kk // 2), generator=gen, dtype=torch.int8)

    def scales(n, kk):
        return torch.randint(119, 125, (e, n, kk // 32), generator=gen, dtype=torch.int32).to(torch.uint8)

    ex = ExpertWeights("mxfp4", packed(i, d), scales(i, d), packed(d, i), scales(d, i), packed(i, d), scales(i, d))
    x = torch.randn(m, d, generator=gen).to(torch.bfloat16)
    ids = torch.rand(m, e, generator=gen).topk(k, dim=1).indices
    w = torch.rand(m, k, generator=gen) + 0.2
    whole = fused_moe_ref(x, ids, w, ex, out_dtype=torch.float32)
    total = torch.zeros(m, d)
    for lo in (0, 2):
        part = ExpertWeights("mxfp4", *(getattr(ex, f)[lo:lo + 2] for f in
                                        ("w1", "w1_scale", "w2", "w2_scale", "w3", "w3_scale")))
        local = torch.where((ids >= lo) & (ids < lo + 2), ids - lo, -1)
        total += fused_moe_ref(x, local, w, part, out_dtype=torch.float32)
    assert float((total - whole).abs().max()) <= 1e-6 * float(whole.abs().max())
    assert float(whole.abs().max()) > 0


def test_ranks_fill_replicated_tensors_identically():
    """Two ranks of a tp 2 x ep 2 layout, same seed: every tensor both hold whole (router, norms,
    mHC, q latent, compressors, indexer) is equal, so routing agrees as with a real checkpoint; the
    shards (TP slices, each rank's experts) differ."""
    from types import SimpleNamespace

    from dsv4.distributed.sharding import Layout

    cfg = tiny_config("fp4", "sliding,csa,hca", num_hash_layers=1, moe_intermediate_size=256)
    models = []
    for rank in range(2):
        m = DeepseekV4ForCausalLM(cfg, torch.float32, parallel=SimpleNamespace(tp=2, ep=2, rank=rank))
        m.load_random_weights(7)
        models.append(m)
    layout = Layout(cfg, 2, 2, 0)
    a, b = (dict(m.named_parameters()) | dict(m.named_buffers()) for m in models)
    replicated = [n for n in a if layout.cut(n) is None and layout.owns(n) and a[n].numel()
                  and ".experts." not in n]
    assert len(replicated) > 50
    for n in replicated:
        assert torch.equal(a[n], b[n]), n
    for n in ("layers.0.attn.wq_b.weight", "layers.1.attn.attn_sink", "layers.2.ffn.shared_experts.w2.weight"):
        assert not torch.equal(a[n], b[n]), n
    assert not torch.equal(a["layers.1.ffn.experts.0.w1.weight"], b["layers.1.ffn.experts.4.w1.weight"])
