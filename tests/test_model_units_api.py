"""Unit tests of the reference model's interfaces: sequence-state truncation, forward-input and
weight-loading errors, quantised and written checkpoints loading like their values, what the numerics
switch changes, the API contract (hidden states, MTP target, expert mapping) and the side-stream
fallback off CUDA."""
from __future__ import annotations

import pytest
import torch

from _model_units_helpers import build, rel
from dsv4.checkpoint.writer import quantize_masters, random_master_weights, tiny_config, write_checkpoint
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, set_forward_context
from dsv4.model.hyper import hc_head
from dsv4.quant.fp8 import fake_quant_fp8
from dsv4.quant.mxfp4 import fake_quant_fp4


# ---- state ---------------------------------------------------------------------------------------

def test_truncate_limits_and_refusal_leaves_state_intact():
    cfg = tiny_config("fp4", sliding_window=16)
    model = build(cfg, torch.float32, "transformers")
    state = model.new_sequence_state(max_rollback=4)
    ids = torch.randint(0, cfg.vocab_size, (20,), generator=torch.Generator().manual_seed(7))
    with set_forward_context(ForwardContext([20], [state])):
        model(ids, torch.arange(20))
    with pytest.raises(ValueError, match="cannot truncate"):
        state.truncate(5)
    assert state.num_tokens == 20 and all(layer.num_tokens == 20 for layer in state.layers)
    state.truncate(3)
    with pytest.raises(ValueError, match="cannot truncate"):
        state.truncate(2)  # only 4 behind the furthest point reached (20)
    state.truncate(1)
    assert state.num_tokens == 16
    assert state.layers[1].num_entries("main") == 4 and state.layers[2].num_entries("main") == 0


def test_forward_input_errors():
    cfg = tiny_config("fp4", layers="sliding,csa")
    model = build(cfg, torch.float32, "transformers")
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="out of range"):
        model(torch.tensor([1, cfg.vocab_size]), torch.arange(2))
    with pytest.raises(ValueError, match="positions"):
        model(ids, torch.tensor([0, 1, 3]))
    state = model.new_sequence_state()
    with pytest.raises(ValueError, match="seq_lens"), set_forward_context(ForwardContext([2], [state])):
        model(ids, torch.arange(3))
    assert state.num_tokens == 0
    with pytest.raises(ValueError, match="input_ids are required"):
        model(None, torch.arange(3), inputs_embeds=model.embed_input_ids(ids))
    with pytest.raises(ValueError, match="numerics"):
        DeepseekV4ForCausalLM(cfg, torch.float32, "fast")


# ---- weights -------------------------------------------------------------------------------------

@pytest.mark.parametrize("expert_dtype", ["fp4", "fp8"])
def test_quantized_tensors_load_like_their_dequantized_values(expert_dtype):
    from dsv4.quant.fp8 import dequantize_fp8_block
    from dsv4.quant.mxfp4 import dequantize_mxfp4
    cfg = tiny_config(expert_dtype, layers="sliding,csa")
    stored = quantize_masters(cfg, random_master_weights(cfg, 8))
    quantized = DeepseekV4ForCausalLM(cfg, torch.float32, "reference")
    assert "layers.1.ffn.experts.3.w2.weight" in quantized.load_weights(stored.items())
    quantized.load_mtp_weights(stored.items())
    quantized.finalize_weights()
    plain = {}
    for name, t in stored.items():
        if name.endswith(".scale"):
            continue
        scale = stored.get(name[: -len("weight")] + "scale")
        if scale is None:
            plain[name] = t
        elif t.dtype == torch.int8:
            plain[name] = dequantize_mxfp4(t, scale)
        else:
            plain[name] = dequantize_fp8_block(t, scale)
    dequantized = build_from(cfg, plain)
    ids = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(9))
    a = quantized.compute_logits(quantized(ids, torch.arange(12)))
    b = dequantized.compute_logits(dequantized(ids, torch.arange(12)))
    assert torch.equal(a, b)
    assert quantized.mtp[0].ready


def build_from(cfg, tensors, numerics="reference"):
    model = DeepseekV4ForCausalLM(cfg, torch.float32, numerics)
    model.load_weights(tensors.items())
    model.load_mtp_weights(tensors.items())
    model.finalize_weights()
    return model


def test_load_errors_name_the_tensor():
    cfg = tiny_config("fp4", layers="sliding,csa")
    masters = random_master_weights(cfg, 10)
    model = DeepseekV4ForCausalLM(cfg, torch.float32)
    with pytest.raises(ValueError, match="layers.0.attn.wq_a.weight: shape"):
        model.load_weights([("layers.0.attn.wq_a.weight", torch.zeros(3, 3))])
    with pytest.raises(ValueError, match="layers.9.attn.wq_a.weight: unexpected"):
        model.load_weights([("layers.9.attn.wq_a.weight", torch.zeros(3, 3))])
    with pytest.raises(ValueError, match="never quantised"):
        model.load_weights([("layers.1.attn.compressor.wkv.weight", torch.zeros(512, 256, dtype=torch.int8))])
    model.load_weights((n, t) for n, t in masters.items() if n != "layers.1.attn.indexer.wq_b.weight")
    with pytest.raises(ValueError, match="missing 1 backbone tensors.*indexer.wq_b"):
        model.finalize_weights()
    with pytest.raises(RuntimeError, match="finalize_weights"):
        model(torch.tensor([1]), torch.tensor([0]))
    model.load_weights([("layers.1.attn.indexer.wq_b.weight", masters["layers.1.attn.indexer.wq_b.weight"])])
    model.finalize_weights()  # MTP absent entirely is fine; partial MTP is not
    assert not model.mtp[0].ready
    model.load_mtp_weights([("mtp.0.e_proj.weight", masters["mtp.0.e_proj.weight"])])
    with pytest.raises(ValueError, match="missing .* MTP tensors"):
        model.finalize_weights()
    bad = dict(masters)
    bad["layers.0.ffn.gate.tid2eid"] = bad["layers.0.ffn.gate.tid2eid"] + cfg.n_routed_experts
    with pytest.raises(ValueError, match="tid2eid: expert ids"):
        build_from(cfg, bad)


def test_load_model_from_written_checkpoint(tmp_path):
    import dsv4
    cfg = tiny_config("fp4", layers="sliding,hca")
    masters = random_master_weights(cfg, 11)
    write_checkpoint(tmp_path / "ckpt", cfg, masters)
    model = dsv4.load_model(tmp_path / "ckpt", numerics="transformers")
    ref = build_from_quantized(cfg, quantize_masters(cfg, masters), "transformers")
    ids = torch.randint(0, cfg.vocab_size, (9,), generator=torch.Generator().manual_seed(12))
    assert torch.equal(model(ids, torch.arange(9)), ref(ids, torch.arange(9)))
    assert model.mtp[0].ready
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    with pytest.raises(ValueError):
        dsv4.load_model(tmp_path / "ckpt")


def build_from_quantized(cfg, stored, numerics):
    return build_from(cfg, stored, numerics)


def test_numerics_switch_changes_only_what_it_names():
    cfg = tiny_config("fp4", layers="csa")
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(13))
    outs = {n: build(cfg, torch.float32, n).forward(ids, torch.arange(40)) for n in ("reference", "transformers")}
    assert 1e-4 < rel(outs["reference"], outs["transformers"]) < 0.5
    model = build(cfg, torch.float32, "reference")
    state = model.new_sequence_state()
    with set_forward_context(ForwardContext([40], [state])):
        model(ids, torch.arange(40))
    kv = state.layers[0].window()[0]  # nope dims on the FP8 grid, rope dims not
    nope = kv[:, : cfg.nope_dim]
    assert torch.equal(fake_quant_fp8(nope, 64), nope)
    assert not torch.equal(fake_quant_fp8(kv[:, cfg.nope_dim:], 64), kv[:, cfg.nope_dim:])
    keys = state.layers[0].entries("index")
    assert keys.shape[0] == 10 and torch.equal(fake_quant_fp4(keys, 32), keys)


def test_api_contract_names_hidden_states_and_mtp_target():
    from dsv4.checkpoint.naming import expected_inventory
    cfg = tiny_config("fp4")
    model = build(cfg, torch.float32, "reference")
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    assert names == set(expected_inventory(cfg, include_mtp=True, quantized=False))
    ids = torch.randint(0, cfg.vocab_size, (10,), generator=torch.Generator().manual_seed(14))
    hidden = model(ids, torch.arange(10))
    target = model.get_mtp_target_hidden_states()
    assert hidden.shape == (10, cfg.hidden_size) and target.shape == (10, cfg.hc_mult * cfg.hidden_size)
    collapsed = hc_head(target.unflatten(-1, (cfg.hc_mult, -1)), model.hc_head_fn, model.hc_head_base,
                        model.hc_head_scale, hc_eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps)
    assert torch.equal(model.norm(collapsed), hidden)
    logits = model.compute_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (10, cfg.vocab_size)
    assert torch.equal(model(ids, torch.arange(10), inputs_embeds=model.embed_input_ids(ids)), hidden)
    mapping = model.get_expert_mapping()
    assert len(mapping) == 3 * cfg.n_routed_experts
    assert ("experts.w13_", "experts.5.w3.", 5, "w3") in mapping
    assert ("experts.w2_", "experts.0.w2.", 0, "w2") in mapping


def test_side_stream_branch_runs_inline_off_cuda_and_past_its_limits():
    """Off CUDA, for a branch not in OVERLAP, or above MAX_ROWS, `start_beside` runs the branch at once (on
    the current stream) and its join returns that result; the arrival-counter lane stays the main one."""
    from dsv4.kernels import _triton
    from dsv4.model import side_stream as ss

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    calls = []

    def branch(t):
        calls.append(_triton.counter_lane)
        return t * 2, (t + 1,)

    cases = [("shared_expert", 3), ("unknown_branch", 3), ("projections", ss.MAX_ROWS + 1)]
    for name, rows in cases:
        join = ss.start_beside(torch.device("cpu"), name, rows, branch, x)
        assert len(calls) == cases.index((name, rows)) + 1  # ran before the join
        doubled, (plus_one,) = join()
        assert torch.equal(doubled, x * 2) and torch.equal(plus_one, x + 1)
    assert calls == [0, 0, 0]
