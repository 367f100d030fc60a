"""Stacked FP8 linears on the Triton kernel (dsv4.model.linear.stacked_fp8_forward, Attention.fuse_fp8_pairs):
one GEMM over row-stacked weights gives bit for bit the separate launches' outputs, including where the
stack's own grid would split K differently from its parts; kernel-mode `prepare` and whole-model logits
are unchanged by the fusion. Fresh random inputs, poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch

# imported here, not first inside a `with torch.device("cuda")` block: dsv4.quant.fp8 makes a module-level
# constant tensor on the default device at import
from dsv4.checkpoint.writer import random_master_weights, tiny_config, write_checkpoint
from dsv4.model.attention import Attention
from dsv4.model.linear import FP8, Linear, quantized_weights, stack_fp8_linears, stacked_fp8_forward
from dsv4.model.numerics import resolve_numerics

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
CPU_INTERP = DEV == "cpu"
BF16 = torch.bfloat16

# (row counts of the parts, input width); the interpreter takes minutes for the full-size ones
PAIRS = [((128, 256), 256)]  # tiny: one K block per split
if not CPU_INTERP:
    PAIRS += [
        ((1024, 512), 4096),    # Flash wq_a | wkv: both split K 16 ways at batch 1
        ((16384, 1024), 512),   # parts split K 2 ways, the stack's own grid would not split: explicit split
        ((8192, 8192), 1024),   # a TP=4 shard of wq_b | indexer wq_b: 4 ways each, the stack alone 2
    ]


def _linears(widths, k: int, gen: torch.Generator):
    with torch.device(DEV), quantized_weights("fp8"):
        lins = [Linear(k, n, BF16, resolve_numerics("reference"), FP8) for n in widths]
    for lin, n in zip(lins, widths):
        mag = torch.exp2(torch.randint(-3, 3, (n // 128, 1), generator=gen, device=DEV).float())
        w = torch.randn(n, k, generator=gen, device=DEV) * k ** -0.5 * mag.repeat_interleave(128, 0)
        lin.load_master("w.weight", w)
    return lins


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("m", [1, 3, 40])
@pytest.mark.parametrize("widths,k", PAIRS)
def test_stacked_gemm_is_bit_identical_to_separate_launches(widths, k, m, poison):
    gen = torch.Generator(DEV).manual_seed(sum(widths) + k + m)
    lins = _linears(widths, k, gen)
    mag = torch.exp2(torch.randint(-4, 4, (m, k // 128), generator=gen, device=DEV).float())
    x = (torch.randn(m, k, generator=gen, device=DEV) * mag.repeat_interleave(128, 1)).to(BF16)
    separate = [lin(x, input_ready=True) for lin in lins]
    stack = stack_fp8_linears(lins)
    assert stack is not None
    poison()
    fused = stacked_fp8_forward(stack, x)
    assert fused is not None and len(fused) == len(lins)
    for f, s in zip(fused, separate):
        assert torch.isfinite(f).all() and torch.equal(_bits(f), _bits(s))
    for f, s in zip(fused, [lin(x, input_ready=True) for lin in lins]):  # the linears now read the stack's rows
        assert torch.equal(_bits(f), _bits(s))


@pytest.mark.skipif(CPU_INTERP, reason="full-size weights")
def test_flash_wq_b_with_indexer_wq_b_stays_separate_at_batch_1():
    """wq_b [32768, 1024] alone splits K 1 way, the indexer's [8192, 1024] 4 ways: no single launch
    reproduces both, so the pair runs as two launches (same bits as unfused by construction)."""
    gen = torch.Generator(DEV).manual_seed(3)
    stack = stack_fp8_linears(_linears((32768, 8192), 1024, gen))
    x = torch.randn(1, 1024, generator=gen, device=DEV).to(BF16)
    assert stacked_fp8_forward(stack, x) is None
    assert stacked_fp8_forward(stack, x.expand(17, -1).contiguous()) is not None  # prefill tiles never split K


def _kernel_layer(kind: str, seed: int):
    cfg = tiny_config("fp8", kind)
    with torch.device(DEV), quantized_weights("fp8"):
        attn = Attention(cfg, cfg.layer(0), BF16, resolve_numerics("reference"))
    gen = torch.Generator(DEV).manual_seed(seed)
    with torch.no_grad():
        for name, mod in attn.named_modules():
            if getattr(mod, "kernel_format", None) is not None:
                n, k = mod.weight.shape
                mod.load_master(f"{name}.weight", torch.randn(n, k, generator=gen, device=DEV) * k ** -0.5)
        for name, p in attn.named_parameters():
            if p.dtype != torch.float8_e4m3fn:
                scale = 1.0 if ("norm" in name or name.endswith("ape") or "sink" in name) else p.shape[-1] ** -0.5
                p.copy_((torch.randn(p.shape, generator=gen, device=DEV) * scale).to(p.dtype))
    attn.use_kernels = True
    if attn.indexer:
        attn.indexer.use_kernels = True
    return cfg, attn, gen


@pytest.mark.parametrize("kind", ["csa", "sliding"])
def test_kernel_mode_prepare_unchanged_by_fusion(kind, poison):
    cfg, attn, gen = _kernel_layer(kind, seed=21 if kind == "csa" else 22)
    a = torch.randn(1, cfg.hidden_size, generator=gen, device=DEV).to(BF16)
    positions = torch.tensor([4099], device=DEV)
    ref = attn.prepare(a, positions)
    attn.fuse_fp8_pairs()
    assert set(attn._fp8_stacks) == ({"a", "q_latent"} if kind == "csa" else {"a"})
    poison()
    got = attn.prepare(a, positions)
    for field in ("q", "kv", "index_q", "index_w"):
        g, r = getattr(got, field), getattr(ref, field)
        assert (g is None) == (r is None) == (kind != "csa" and field.startswith("index")), field
        if g is not None:
            assert torch.isfinite(g).all() and torch.equal(_bits(g), _bits(r)), field


@pytest.mark.skipif(CPU_INTERP, reason="a whole model through the interpreter is too slow")
def test_model_logits_unchanged_by_fusion(tmp_path):
    from dsv4 import load_model
    from dsv4.model import ForwardContext, set_forward_context

    cfg = tiny_config("fp4", "sliding,csa,hca,csa")
    model = load_model(write_checkpoint(tmp_path / "m", cfg, random_master_weights(cfg, seed=5)), DEV, BF16,
                       kernels="triton")
    assert all(b.attn._fp8_stacks for b in model.layers)
    gen = torch.Generator().manual_seed(9)
    prompt = torch.randint(2, cfg.vocab_size, (7,), generator=gen)
    steps = torch.randint(2, cfg.vocab_size, (4,), generator=gen).tolist()

    def run() -> torch.Tensor:
        state, out, pos = model.new_sequence_state(), [], 0
        with torch.no_grad():
            for ids in [prompt] + [torch.tensor([t]) for t in steps]:
                with set_forward_context(ForwardContext([ids.numel()], [state])):
                    h = model(ids.to(DEV), torch.arange(pos, pos + ids.numel(), device=DEV))
                    out.append(model.compute_logits(h).float().cpu())
                pos += ids.numel()
        return torch.cat(out)

    fused = run()
    for b in model.layers:
        b.attn._fp8_stacks.clear()
    separate = run()
    assert torch.isfinite(fused).all() and torch.equal(fused, separate)
