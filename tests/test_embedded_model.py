"""The embedded default model (dsv4/assets/tiny): official file set, tensor inventory re-derived from
checkpoint_format.md §3, valid FP8/MXFP4 encodings, tokenizer round trips, and — through transformers
(independent of dsv4) and through dsv4 itself — that the model is trained: low held-out perplexity
and greedy continuations made of real words."""
from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import dsv4

TINY = Path(dsv4.__file__).parent / "assets" / "tiny"
REPO = Path(__file__).resolve().parents[1]
MAX_BYTES = 8_000_000
SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
           "<｜latest_reminder｜>", "<think>", "</think>", "｜DSML｜", "<｜action｜>", "<｜query｜>",
           "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>"]
PROMPTS = ["The following methods can be defined to", "If the exception"]
ITEMSIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}


def _trainer():
    spec = importlib.util.spec_from_file_location("train_tiny", REPO / "tools" / "train_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cfg() -> dict:
    return json.loads((TINY / "config.json").read_text())


@pytest.fixture(scope="module")
def headers() -> dict[str, tuple[str, dict]]:
    """name -> (shard file, header entry), read straight from the safetensors bytes."""
    out = {}
    for shard in sorted(TINY.glob("model-*.safetensors")):
        with open(shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, entry in header.items():
            assert name not in out, f"{name} stored twice"
            out[name] = (shard.name, entry)
    return out


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(TINY / "tokenizer.json"))


@pytest.fixture(scope="module")
def heldout_chunk(tok) -> torch.Tensor:
    _, held = _trainer().load_corpus()
    text = "\n".join(held.values())
    return torch.tensor([0] + tok.encode(text).ids[:255])


@pytest.fixture(scope="module")
def corpus_words() -> set[str]:
    from pydoc_data.topics import topics
    return {w for text in topics.values() for w in re.findall(r"[a-z]+", text.lower())}


@pytest.fixture(scope="module")
def hf_model():
    from transformers import DeepseekV4ForCausalLM, FineGrainedFP8Config
    model, info = DeepseekV4ForCausalLM.from_pretrained(
        TINY, dtype=torch.float32, output_loading_info=True,
        quantization_config=FineGrainedFP8Config(dequantize=True, expert_dtype="fp4", scale_fmt="ue8m0"))
    bad = {k: [n for n in v if not n.startswith("mtp.")] for k, v in info.items() if v}
    assert not any(bad.values()), f"transformers could not load every tensor: {bad}"
    return model.float().eval()


# ---- files, config, inventory ------------------------------------------------------------------

def test_official_file_set_and_size(cfg):
    files = {p.name: p.stat().st_size for p in TINY.iterdir()}
    shards = [n for n in files if re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", n)]
    assert len(shards) >= 2
    assert set(files) == {"config.json", "generation_config.json", "model.safetensors.index.json",
                          "tokenizer.json", "tokenizer_config.json", *shards}
    assert sum(files.values()) <= MAX_BYTES
    gen = json.loads((TINY / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 1)
    tc = json.loads((TINY / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast" and "chat_template" not in tc
    assert (tc["bos_token"], tc["eos_token"], tc["add_bos_token"]) == (SPECIAL[0], SPECIAL[1], False)


def test_config_covers_every_block_kind(cfg):
    from dsv4.config import ModelConfig
    mc = ModelConfig.from_file(TINY)
    assert set(mc.layer_kind_counts()) == {"sliding", "csa", "hca"} and all(mc.layer_kind_counts().values())
    moe = [spec.moe for spec in mc.layers]
    assert "hash" in moe and "topk" in moe
    assert mc.num_nextn_predict_layers == 1 and mc.expert_dtype == "fp4"
    assert mc.quantization is not None and mc.quantization.scale_fmt == "ue8m0"
    # every FP8 linear tiles into 128x128 blocks; experts into 32-wide MXFP4 groups
    for dim in (mc.hidden_size, mc.q_lora_rank, mc.num_heads * mc.head_dim, mc.head_dim,
                mc.o_groups * mc.o_lora_rank, mc.num_heads * mc.head_dim // mc.o_groups,
                mc.moe_intermediate_size, mc.index_n_heads * mc.index_head_dim):
        assert dim % 128 == 0, dim


def expected_inventory(c: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """checkpoint_format.md §3, written out from the spec tables."""
    D, H, Dh, Rq = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    G, Ro, E, I = c["o_groups"], c["o_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"]
    V, hc, k = c["vocab_size"], c["hc_mult"], c["num_experts_per_tok"]
    nI, dI = c["index_n_heads"], c["index_head_dim"]
    inv: dict[str, tuple[tuple[int, ...], str]] = {}

    def fp8(name, n, kk):
        inv[name + ".weight"] = ((n, kk), "F8_E4M3")
        inv[name + ".scale"] = ((math.ceil(n / 128), math.ceil(kk / 128)), "F8_E8M0")

    def fp4(name, n, kk):
        inv[name + ".weight"] = ((n, kk // 2), "I8")
        inv[name + ".scale"] = ((n, kk // 32), "F8_E8M0")

    def hc_head(p):
        inv[p + "hc_head_fn"], inv[p + "hc_head_base"] = ((hc, hc * D), "F32"), ((hc,), "F32")
        inv[p + "hc_head_scale"] = ((1,), "F32")

    def block(p, ratio, hashed):
        for sub in ("attn", "ffn"):
            inv[f"{p}hc_{sub}_fn"] = (((2 + hc) * hc, hc * D), "F32")
            inv[f"{p}hc_{sub}_base"] = (((2 + hc) * hc,), "F32")
            inv[f"{p}hc_{sub}_scale"] = ((3,), "F32")
            inv[f"{p}{sub}_norm.weight"] = ((D,), "BF16")
        inv[p + "attn.attn_sink"] = ((H,), "F32")
        fp8(p + "attn.wq_a", Rq, D)
        inv[p + "attn.q_norm.weight"] = ((Rq,), "BF16")
        fp8(p + "attn.wq_b", H * Dh, Rq)
        fp8(p + "attn.wkv", Dh, D)
        inv[p + "attn.kv_norm.weight"] = ((Dh,), "BF16")
        fp8(p + "attn.wo_a", G * Ro, H * Dh // G)
        fp8(p + "attn.wo_b", D, G * Ro)
        inv[p + "ffn.gate.weight"] = ((E, D), "BF16")
        if hashed:
            inv[p + "ffn.gate.tid2eid"] = ((V, k), "I64")
        else:
            inv[p + "ffn.gate.bias"] = ((E,), "F32")
        fp8(p + "ffn.shared_experts.w1", I, D)
        fp8(p + "ffn.shared_experts.w3", I, D)
        fp8(p + "ffn.shared_experts.w2", D, I)
        for e in range(E):
            fp4(f"{p}ffn.experts.{e}.w1", I, D)
            fp4(f"{p}ffn.experts.{e}.w3", I, D)
            fp4(f"{p}ffn.experts.{e}.w2", D, I)
        if ratio:
            width = Dh if ratio == 128 else 2 * Dh
            inv[p + "attn.compressor.ape"] = ((ratio, width), "F32")
            inv[p + "attn.compressor.wkv.weight"] = ((width, D), "BF16")
            inv[p + "attn.compressor.wgate.weight"] = ((width, D), "BF16")
            inv[p + "attn.compressor.norm.weight"] = ((Dh,), "BF16")
        if ratio == 4:
            fp8(p + "attn.indexer.wq_b", nI * dI, Rq)
            inv[p + "attn.indexer.weights_proj.weight"] = ((nI, D), "BF16")
            inv[p + "attn.indexer.compressor.ape"] = ((4, 2 * dI), "F32")
            inv[p + "attn.indexer.compressor.wkv.weight"] = ((2 * dI, D), "BF16")
            inv[p + "attn.indexer.compressor.wgate.weight"] = ((2 * dI, D), "BF16")
            inv[p + "attn.indexer.compressor.norm.weight"] = ((dI,), "BF16")

    inv["embed.weight"], inv["head.weight"] = ((V, D), "BF16"), ((V, D), "BF16")
    inv["norm.weight"] = ((D,), "BF16")
    hc_head("")
    ratios = c["compress_ratios"]
    for layer in range(c["num_hidden_layers"]):
        block(f"layers.{layer}.", ratios[layer], layer < c["num_hash_layers"])
    block("mtp.0.", 0, False)
    fp8("mtp.0.e_proj", D, D)
    fp8("mtp.0.h_proj", D, D)
    for n in ("enorm", "hnorm", "norm"):
        inv[f"mtp.0.{n}.weight"] = ((D,), "BF16")
    hc_head("mtp.0.")
    return inv


def test_inventory_matches_spec(cfg, headers):
    index = json.loads((TINY / "model.safetensors.index.json").read_text())
    expected = expected_inventory(cfg)
    assert set(headers) == set(expected)
    assert index["weight_map"] == {n: shard for n, (shard, _) in headers.items()}
    total = 0
    for name, (_, entry) in headers.items():
        shape, dtype = expected[name]
        assert (tuple(entry["shape"]), entry["dtype"]) == (shape, dtype), name
        nbytes = math.prod(shape) * ITEMSIZE[dtype]
        assert entry["data_offsets"][1] - entry["data_offsets"][0] == nbytes, name
        total += nbytes
    assert index["metadata"]["total_size"] == total


def test_encodings_are_valid_and_mxfp4_reencodes_losslessly(headers):
    from safetensors import safe_open
    handles = {s: safe_open(str(TINY / s), "pt") for s in {s for s, _ in headers.values()}}
    get = lambda name: handles[headers[name][0]].get_tensor(name)  # noqa: E731
    for name, (_, entry) in headers.items():
        t = get(name)
        if entry["dtype"] == "F8_E8M0":
            assert (t.view(torch.uint8) != 255).all(), f"{name}: NaN scale"
        elif entry["dtype"] in ("F8_E4M3", "BF16", "F32"):
            assert torch.isfinite(t.float()).all(), name
            assert t.numel() < 4 or t.float().std() > 0, f"{name}: constant"
        if re.search(r"experts\.\d+\.w\d\.scale$", name):
            # checkpoint_format.md §9: lossless FP8 re-encode iff every 32-group exponent of a
            # 128x128 tile is within 14 of the tile maximum
            b = t.view(torch.uint8).int()
            tiles = b.reshape(b.shape[0] // 128, 128, b.shape[1] // 4, 4).permute(0, 2, 1, 3).flatten(2)
            spread = tiles.max(-1).values - tiles.min(-1).values
            assert (spread <= 14).all(), f"{name}: {(spread > 14).sum()} tiles lose precision"


# ---- tokenizer ---------------------------------------------------------------------------------

def test_tokenizer_ids_and_round_trip(cfg, tok):
    for i, s in enumerate(SPECIAL):
        ids = tok.encode(s).ids
        assert len(ids) == 1, s
        if i < 2:
            assert ids[0] == (cfg["bos_token_id"], cfg["eos_token_id"])[i]
    assert tok.get_vocab_size() <= cfg["vocab_size"]
    rng = random.Random(7)
    alphabet = "abcXYZ019 \n\t  .,:;()[]{}_-+=*'\"éüß中文😀｜▁<>/"
    samples = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    samples.append("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>x</think>ok<｜end▁of▁sentence｜>")
    for s in samples:
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s, repr(s)


def test_transformers_tokenizer_agrees(tok):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(TINY)
    text = "<｜User｜>What does  `with`\ndo?<｜Assistant｜></think>It enters a context."
    ids = hf.encode(text)
    assert ids == tok.encode(text).ids and ids[0] != 0  # no BOS added
    assert hf.decode(ids) == text
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 1)


# ---- trained behaviour -------------------------------------------------------------------------

def _nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return F.cross_entropy(logits.float()[:-1], ids[1:]).item()


def _greedy(next_logits, tok, prompt: str, n: int = 24) -> str:
    ids = [0] + tok.encode(prompt).ids
    start = len(ids)
    for _ in range(n):
        ids.append(int(next_logits(torch.tensor(ids)).argmax()))
        if ids[-1] == 1:
            break
    return tok.decode(ids[start:])


def _assert_mostly_words(text: str, words: set[str]) -> None:
    found = re.findall(r"[A-Za-z]+", text)
    assert len(found) >= 4, repr(text)
    real = [w for w in found if w.lower() in words]
    assert len(real) >= 0.8 * len(found), repr(text)


@torch.no_grad()
def test_transformers_heldout_perplexity_and_words(hf_model, tok, heldout_chunk, corpus_words):
    ppl = math.exp(_nll(hf_model(input_ids=heldout_chunk[None], use_cache=False).logits[0], heldout_chunk))
    assert ppl < 80, ppl  # trained: ~45 on this chunk; untrained: ~vocab size (2048)
    for prompt in PROMPTS:
        text = _greedy(lambda ids: hf_model(input_ids=ids[None], use_cache=False).logits[0, -1], tok, prompt)
        _assert_mostly_words(text, corpus_words)


@torch.no_grad()
def test_dsv4_runs_the_embedded_model(hf_model, tok, heldout_chunk, corpus_words):
    try:
        model = dsv4.load_model(TINY, numerics="reference")
        plain = dsv4.load_model(TINY, numerics="transformers")
    except (ImportError, AttributeError) as e:
        pytest.skip(f"dsv4 model not available: {e}")

    def logits(ids, m=model):
        return m.compute_logits(m.forward(ids, torch.arange(len(ids))))

    ref = hf_model(input_ids=heldout_chunk[None], use_cache=False).logits[0]
    # simulations off: the same math as transformers, up to fp32 rounding
    torch.testing.assert_close(logits(heldout_chunk, plain), ref, atol=1e-3, rtol=0)
    # FP8 activation/KV and FP4 indexer simulation cost a little on a trained model, not more
    assert abs(_nll(logits(heldout_chunk), heldout_chunk) - _nll(ref, heldout_chunk)) < 0.05
    for prompt in PROMPTS:
        _assert_mostly_words(_greedy(lambda ids: logits(ids)[-1], tok, prompt), corpus_words)


@torch.no_grad()
def test_dsv4_mtp_block_is_trained(heldout_chunk):
    try:
        model = dsv4.load_model(TINY, numerics="reference")
    except (ImportError, AttributeError) as e:
        pytest.skip(f"dsv4 model not available: {e}")
    ids, n = heldout_chunk, len(heldout_chunk)
    main = model.compute_logits(model.forward(ids, torch.arange(n)))
    # deepseek_v4_model.md §2.11: X_L[t] with embed[t+1] at position t predicts token t+2
    _, hidden = model.forward_mtp(model.get_mtp_target_hidden_states()[:-1], ids[1:], torch.arange(n - 1))
    draft = model.mtp[0].compute_logits(hidden)[:-1]
    assert F.cross_entropy(draft, ids[2:]).item() < 5.2  # ~4.6 trained; ~7.6 (ln 2048) untrained
    # a speculative draft is useful only if it often equals the main model's own next greedy token
    assert (draft.argmax(-1) == main[1:-1].argmax(-1)).float().mean() > 0.3  # ~0.45 trained
