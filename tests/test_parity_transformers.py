"""dsv4 (numerics="transformers") against transformers 5.23's own DeepseekV4ForCausalLM.

Both sides read the same official-format checkpoint, each through its own loader (transformers:
its FP8 quantiser with dequantize=True, then `.float()`; spec testing_notes.md). With float32
everywhere transformers has no designed numerical difference left (§4 of the model spec lists only
bf16 roundings, which `.float()` removes, and the routing-weight placement / 1e-20 epsilon, which are
below fp32 noise), so the tolerance is pure summation-order noise: max |Δlogit| <= 1e-4 * std.

The checkpoint has every attention kind (sliding, CSA, HCA) and a hash-routed layer; its indexer has 16 heads
and index_topk 8, so from 36 tokens on (9 compressed entries) the indexer really selects. A Pro-shaped variant has
compressed attention from layer 0 and widths that are not powers of two.
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("accelerate")  # FineGrainedFP8Config needs it even on CPU
pytest.importorskip("transformers")
from transformers import DeepseekV4ForCausalLM, FineGrainedFP8Config  # noqa: E402

import dsv4  # noqa: E402
from dsv4.checkpoint.writer import (PRO_LAYERS, PRO_SHAPE, random_master_weights, tiny_config,  # noqa: E402
                                    write_checkpoint)
from dsv4.model.context import ForwardContext, set_forward_context  # noqa: E402

from helpers_ref import read_checkpoint  # noqa: E402

LAYERS = "sliding,csa,hca,csa"
PROMPT_LENGTHS = (1, 5, 40, 150, 300)
TOL = 1e-4  # max |Δlogit| / std(logits)
# variant: (expert format, layers, config overrides); "pro": V4-Pro's shape (dsv4.checkpoint.writer.PRO_SHAPE)
# with three hash-routed layers
VARIANTS = {"fp4": ("fp4", LAYERS, {}), "fp8": ("fp8", LAYERS, {}),
            "pro": ("fp4", PRO_LAYERS, {**PRO_SHAPE, "num_hash_layers": 3})}
SEEDS = {"fp4": 1, "fp8": 2, "pro": 3}  # fresh weights and prompts per variant

# checkpoint_format.md §11: official block-local name -> transformers name (without "model.layers.N.")
_BLOCK_NAMES = {
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight", "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight", "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight", "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight", "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
_GLOBAL_NAMES = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
                 "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
                 "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}


def transformers_view(sd: dict[str, torch.Tensor], name: str, inter: int) -> torch.Tensor:
    """The tensor transformers holds for official name `name` (a slice for fused expert weights)."""
    if name in _GLOBAL_NAMES:
        return sd[_GLOBAL_NAMES[name]]
    m = re.fullmatch(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight", name)
    if m:
        layer, e, w = int(m[1]), int(m[2]), m[3]
        if w == "w2":
            return sd[f"model.layers.{layer}.mlp.experts.down_proj"][e]
        gate_up = sd[f"model.layers.{layer}.mlp.experts.gate_up_proj"][e]
        return gate_up[:inter] if w == "w1" else gate_up[inter:]
    layer, rest = re.fullmatch(r"layers\.(\d+)\.(.+)", name).groups()
    return sd[f"model.layers.{layer}.{_BLOCK_NAMES[rest]}"]


def load_transformers(path, expert_dtype: str) -> DeepseekV4ForCausalLM:
    qc = FineGrainedFP8Config(dequantize=True, expert_dtype=expert_dtype,
                              scale_fmt="ue8m0" if expert_dtype == "fp4" else "float")
    model, info = DeepseekV4ForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=qc, output_loading_info=True,
        attn_implementation="eager")
    problems = {kind: sorted(k for k in keys if not (kind == "unexpected_keys" and str(k).startswith("mtp.")))
                for kind, keys in info.items()}
    problems = {k: v for k, v in problems.items() if v}
    if problems:  # anything but ignored mtp.* keys makes the comparison meaningless
        raise AssertionError(f"transformers did not load the checkpoint cleanly: {problems}")
    return model.float().eval()  # bf16 leftovers (embed, head, norms, compressor, gate) -> fp32, exact


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    variant = request.param
    expert_dtype, layers, overrides = VARIANTS[variant]
    cfg = tiny_config(expert_dtype, layers, **overrides)
    path = write_checkpoint(tmp_path_factory.mktemp(f"ckpt_{variant}"), cfg,
                            random_master_weights(cfg, seed=10 + SEEDS[variant]))
    ours = dsv4.load_model(path, device="cpu", dtype=torch.float32, numerics="transformers")
    theirs = load_transformers(path, expert_dtype)
    return variant, path, ours, theirs


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref.double()).abs().max() / ref.double().std()).item()


@torch.no_grad()
def dsv4_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model.compute_logits(model.forward(ids, torch.arange(ids.numel())))


@torch.no_grad()
def hf_logits(model, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
    out = model(ids[None], use_cache=False, logits_to_keep=1 if last_only else 0)
    return out.logits[0].float()


def test_checkpoint_setup_exercises_every_path(pair):
    """The test model has what the parity claims cover: all attention kinds, a hash layer, and an
    indexer that selects (index_topk < compressed entries for the longer prompts)."""
    variant, _, _, theirs = pair
    cfg = theirs.config
    kinds = {"compressed_sparse_attention", "heavily_compressed_attention"}
    assert set(cfg.layer_types) == (kinds if variant == "pro" else kinds | {"sliding_attention"})
    assert "hash_moe" in cfg.mlp_layer_types and "moe" in cfg.mlp_layer_types
    assert cfg.index_n_heads >= 16
    assert cfg.index_topk < max(PROMPT_LENGTHS) // 4
    assert max(PROMPT_LENGTHS) >= 2 * 128 and cfg.sliding_window < max(PROMPT_LENGTHS)


def test_transformers_reads_the_same_weights(pair):
    """Both sides must compute with identical numbers: transformers' dequantised tensors equal an
    independent decode of the checkpoint (helpers_ref), bit for bit in fp32."""
    _, path, _, theirs = pair
    _, weights, _ = read_checkpoint(path)
    sd = theirs.state_dict()
    inter = theirs.config.moe_intermediate_size
    checked = 0
    for name, ref in weights.items():
        if name.startswith("mtp."):
            continue
        got = transformers_view(sd, name, inter)
        expect = ref if ref.dtype == torch.int64 else ref.to(torch.float32)
        assert got.shape == expect.shape and torch.equal(got.to(expect.dtype), expect), name
        checked += 1
    assert checked == len([n for n in weights if not n.startswith("mtp.")])


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_prefill_logits_match(pair, length):
    variant, _, ours, theirs = pair
    ids = torch.randint(0, theirs.config.vocab_size, (length,),
                        generator=torch.Generator().manual_seed(1000 * length + SEEDS[variant]))
    ref = hf_logits(theirs, ids)
    got = dsv4_logits(ours, ids)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    err = rel_err(got, ref)
    print(f"\n[parity] variant={variant} T={length}: max|dlogit|/std = {err:.2e}")
    assert err <= TOL, f"variant={variant} T={length}: max|dlogit|/std = {err:.3e} > {TOL}"


def _greedy(step, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens, re-running the whole prefix each step; also the logits of every step."""
    tokens, rows = list(prompt), []
    for _ in range(n):
        rows.append(step(torch.tensor(tokens)))
        tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], torch.stack(rows)


@torch.no_grad()
def _dsv4_incremental_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Prefill once, then one token per forward through the sequence state."""
    state = model.new_sequence_state()
    with set_forward_context(ForwardContext([len(prompt)], [state])):
        hidden = model.forward(torch.tensor(prompt), torch.arange(len(prompt)))
    rows = [model.compute_logits(hidden[-1:])[0]]
    out = [int(rows[-1].argmax())]
    while len(out) < n:
        pos = len(prompt) + len(out) - 1
        with set_forward_context(ForwardContext([1], [state])):
            hidden = model.forward(torch.tensor([out[-1]]), torch.tensor([pos]))
        rows.append(model.compute_logits(hidden)[0])
        out.append(int(rows[-1].argmax()))
    return out, torch.stack(rows)


def test_greedy_continuation_matches(pair):
    """32 greedy tokens after a 110-token prompt: the continuation crosses the 128-token HCA window
    boundary and keeps the indexer selecting. transformers re-runs the whole prefix every step (no
    cache); dsv4 does the same, and also decodes incrementally through its sequence state. Tokens
    must be identical and every step's logits within the prefill tolerance."""
    variant, _, ours, theirs = pair
    prompt = torch.randint(0, theirs.config.vocab_size, (110,),
                           generator=torch.Generator().manual_seed(77 + SEEDS[variant])).tolist()
    ref, ref_rows = _greedy(lambda ids: hf_logits(theirs, ids, last_only=True)[-1], prompt, 32)
    full, full_rows = _greedy(lambda ids: dsv4_logits(ours, ids)[-1], prompt, 32)
    inc, inc_rows = _dsv4_incremental_greedy(ours, prompt, 32)
    n_full = next((i for i, (a, b) in enumerate(zip(full, ref)) if a != b), len(ref))
    n_inc = next((i for i, (a, b) in enumerate(zip(inc, ref)) if a != b), len(ref))
    err_full = rel_err(full_rows[:n_full + 1], ref_rows[:n_full + 1])
    err_inc = rel_err(inc_rows[:n_inc + 1], ref_rows[:n_inc + 1])
    print(f"\n[parity] variant={variant} greedy 110+32: full re-run {n_full}/32 tokens equal, "
          f"max|dlogit|/std {err_full:.3e}; incremental {n_inc}/32 equal, {err_inc:.3e}")
    assert full == ref, f"variant={variant}: dsv4 (full re-run) diverges from transformers at step {n_full}"
    assert inc == ref, f"variant={variant}: dsv4 incremental decode diverges from transformers at step {n_inc}"
    assert err_full <= TOL and err_inc <= TOL, (err_full, err_inc)
