"""Train the embedded tiny DeepSeek-V4 model shipped in `dsv4/assets/tiny/`.

    python tools/train_tiny.py --out dsv4/assets/tiny            # tokenizer + backbone + MTP + checkpoint
    python tools/train_tiny.py --out dsv4/assets/tiny --eval     # perplexity report for docs/embedded_model.md

Corpus: CPython's own English help texts (`pydoc_data.topics`), ~5 % of the topics held out.
Trainer: transformers' DeepSeek-V4 port (independent of dsv4), fp32, one CPU thread, AdamW + cosine.
The MTP block (`mtp.0`) is trained afterwards on the frozen backbone. The trained fp32 masters are
converted to official tensor names and written by dsv4's checkpoint writer (FP8 linears, MXFP4 experts).
Everything is seeded; same Python/torch versions => same files.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEED = 1234
SPECIAL_TOKENS = [  # BOS must be id 0 and EOS id 1 (config bos/eos ids)
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>",
    "<think>", "</think>", "｜DSML｜", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
    "<｜title｜>", "<｜read_url｜>",
]
BOS, EOS = 0, 1
VOCAB_SIZE = 2048
HELDOUT_FRACTION = 0.05

# Hyperparameters of the documented run (tools/README.md).
SEQ_LEN = 384          # 3 complete HCA entries, 96 CSA entries per training window
BATCH = 4
STEPS = 330
LR, LR_MIN_FRAC, WARMUP = 2.5e-3, 0.1, 30
WEIGHT_DECAY = 0.1
BIAS_UPDATE = 2e-3     # aux-loss-free balancing: router bias step per optimizer step
MTP_STEPS = 90
MTP_LR = 2e-3
EVAL_EVERY = 100


def model_config(vocab_size: int = VOCAB_SIZE) -> dict:
    """Official (legacy-key) config.json of the tiny model. Every linear dim is a multiple of 128."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 128,
        "o_groups": 2,
        "o_lora_rank": 128,
        "sliding_window": 128,
        "compress_ratios": [0, 4, 128, 4, 0],  # SWA, CSA, HCA, CSA, MTP
        "num_hash_layers": 2,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576,
        "index_n_heads": 16,
        "index_head_dim": 128,
        "index_topk": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "expert_dtype": "fp4",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    }


# ---- corpus and tokenizer --------------------------------------------------------------------

def load_corpus() -> tuple[dict[str, str], dict[str, str]]:
    """(train, held_out) topics. Held-out = topics in sha256-name order until 5 % of the characters."""
    from pydoc_data.topics import topics
    total = sum(len(v) for v in topics.values())
    order = sorted(topics, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    held, n = [], 0
    for name in order:
        if n >= HELDOUT_FRACTION * total:
            break
        held.append(name)
        n += len(topics[name])
    train = {k: topics[k] for k in sorted(topics) if k not in held}
    return train, {k: topics[k] for k in sorted(held)}


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    assert tok.token_to_id(SPECIAL_TOKENS[0]) == BOS and tok.token_to_id(SPECIAL_TOKENS[1]) == EOS
    return tok


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
            "bos_token": SPECIAL_TOKENS[BOS], "eos_token": SPECIAL_TOKENS[EOS], "pad_token": SPECIAL_TOKENS[EOS],
            "model_max_length": 1048576, "legacy": True, "unk_token": None,
            "clean_up_tokenization_spaces": False}


def generation_config() -> dict:
    return {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": True, "temperature": 1.0, "top_p": 1.0}


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for text in texts:
        ids += [BOS] + tok.encode(text).ids + [EOS]
    return torch.tensor(ids, dtype=torch.long)


def sample_batch(stream: torch.Tensor, gen: torch.Generator, batch: int, seq_len: int) -> torch.Tensor:
    """Random windows, each starting with BOS as every prompt does."""
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
    rows = [torch.cat([torch.tensor([BOS]), stream[s:s + seq_len - 1]]) for s in starts.tolist()]
    return torch.stack(rows)


def eval_chunks(tok, texts: list[str], seq_len: int = SEQ_LEN) -> list[torch.Tensor]:
    """Held-out text as non-overlapping BOS-prefixed chunks (the same chunks for every evaluator)."""
    chunks = []
    for text in texts:
        ids = tok.encode(text).ids + [EOS]
        for i in range(0, len(ids), seq_len - 1):
            piece = ids[i:i + seq_len - 1]
            if len(piece) >= 2:
                chunks.append(torch.tensor([BOS] + piece))
    return chunks


# ---- transformers model ----------------------------------------------------------------------

def hf_config(cfg: dict, **override):
    from transformers import DeepseekV4Config
    # deep copy: transformers edits nested dicts (rope_scaling) in place
    d = copy.deepcopy({k: v for k, v in cfg.items() if k not in ("quantization_config", "architectures", "torch_dtype")})
    d.update(override)
    return DeepseekV4Config(**d)


def _indexer_scores(self, q: torch.Tensor, compressed_kv: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """Same math as transformers' DeepseekV4IndexerScorer.forward as one batched GEMM: the stock
    broadcast matmul copies the compressed keys once per query, ~20 % of a training step on CPU."""
    scores = F.relu(torch.einsum("bshd,btd->bsht", q.float(), compressed_kv.float())) * self.softmax_scale
    weights = self.weights_proj(hidden_states).float() * self.weights_scaling
    return torch.einsum("bsht,bsh->bst", scores, weights)


def build_model(cfg: dict, gen: torch.Generator):
    from transformers import DeepseekV4ForCausalLM
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4IndexerScorer
    DeepseekV4IndexerScorer.forward = _indexer_scores
    model = DeepseekV4ForCausalLM(hf_config(cfg)).float()
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    k, n_exp = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    for layer in model.model.layers[:cfg["num_hash_layers"]]:
        # Hash routing: a fixed random set of k distinct experts per token id.
        table = torch.stack([torch.randperm(n_exp, generator=gen)[:k] for _ in range(cfg["vocab_size"])])
        layer.mlp.gate.tid2eid.copy_(table)
    return model


class RouterBalancer:
    """DeepSeek's aux-loss-free balancing: nudge each top-k router's bias toward uniform expert load."""

    def __init__(self, routers: list[nn.Module], n_experts: int):
        self.routers, self.n_experts = routers, n_experts
        self.loads = [torch.zeros(n_experts) for _ in routers]
        for i, r in enumerate(routers):
            r.register_forward_hook(lambda mod, args, out, i=i: self._count(i, out[2]))

    def _count(self, i: int, indices: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            self.loads[i] += torch.bincount(indices.flatten(), minlength=self.n_experts).float()

    @torch.no_grad()
    def step(self, rate: float) -> None:
        for r, load in zip(self.routers, self.loads):
            r.e_score_correction_bias += rate * torch.sign(load.mean() - load)
            load.zero_()


class IndexerDistiller:
    """KL loss that teaches each lightning indexer the main attention's distribution over compressed
    entries (the indexer's top-k is not differentiable, so without it the indexer stays random).
    The indexer's inputs are detached: this loss trains only indexer parameters."""

    def __init__(self, model):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
        self.rope = m.apply_rotary_pos_emb
        self.losses: list[torch.Tensor] = []
        for layer in model.model.layers:
            comp = layer.self_attn.compressor
            if comp is None or not hasattr(comp, "indexer"):
                continue
            st: dict = {}
            attn = layer.self_attn
            attn.register_forward_pre_hook(lambda mod, a, kw, st=st: st.update(pe=kw["position_embeddings"],
                                                                                pos=kw["position_ids"]),
                                           with_kwargs=True)
            attn.q_b_norm.register_forward_hook(lambda mod, a, out, st=st: st.update(q=out))
            comp.indexer.register_forward_pre_hook(lambda mod, a: (a[0].detach(), a[1].detach(), *a[2:]))
            comp.indexer.scorer.register_forward_hook(lambda mod, a, out, st=st: st.update(scores=out))
            comp.register_forward_hook(lambda mod, a, out, st=st, attn=attn: self._loss(st, attn, out[0]))

    def _loss(self, st: dict, attn, compressed_kv: torch.Tensor) -> None:
        if not torch.is_grad_enabled() or compressed_kv.shape[2] == 0:
            return
        cos, sin = st["pe"]["compress"]
        with torch.no_grad():
            q = self.rope(st["q"], cos, sin)                                     # [B, H, S, Dh]
            logits = q @ compressed_kv.transpose(-1, -2) * attn.scaling          # [B, H, S, C]
            visible = torch.arange(logits.shape[-1]) < ((st["pos"] + 1) // 4)[..., None]  # [B, S, C]
            logits = logits.masked_fill(~visible[:, None], float("-inf"))
            target = torch.softmax(logits, -1).nan_to_num(0.0).sum(1)
            target = target / target.sum(-1, keepdim=True).clamp_min(1e-9)
        scores = st["scores"].masked_fill(~visible, -1e9)  # finite: rows with no entry stay NaN-free
        logp = torch.log_softmax(scores, -1)
        kl = (target * (target.clamp_min(1e-9).log() - logp)).sum(-1)
        self.losses.append(kl[visible.any(-1).expand_as(kl)].mean())

    def pop(self) -> torch.Tensor:
        out = torch.stack(self.losses).mean() if self.losses else torch.zeros(())
        self.losses.clear()
        return out


def lr_at(step: int, total: int, peak: float) -> float:
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    frac = (step - WARMUP) / max(1, total - WARMUP)
    return peak * (LR_MIN_FRAC + (1 - LR_MIN_FRAC) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(named_params, lr: float):
    decay, plain = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and "hc" not in name else plain).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": plain, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


@torch.no_grad()
def heldout_nll(model, chunks: list[torch.Tensor]) -> float:
    """Mean next-token NLL over all held-out chunks (token-weighted)."""
    total, count = 0.0, 0
    for ids in chunks:
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        total += F.cross_entropy(logits[:-1], ids[1:], reduction="sum").item()
        count += len(ids) - 1
    return total / count


def train_backbone(model, cfg, stream, chunks, log) -> list[dict]:
    gen = torch.Generator().manual_seed(SEED + 1)
    routers = [layer.mlp.gate for layer in model.model.layers[cfg["num_hash_layers"]:]]
    balancer = RouterBalancer(routers, cfg["n_routed_experts"])
    distiller = IndexerDistiller(model)
    opt = make_optimizer(model.named_parameters(), LR)
    history, t0, run_loss = [], time.time(), 0.0
    model.train()
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, STEPS, LR)
        ids = sample_batch(stream, gen, BATCH, SEQ_LEN)
        lm = model(input_ids=ids, labels=ids, use_cache=False).loss
        kl = distiller.pop()
        (lm + kl).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        balancer.step(BIAS_UPDATE)
        run_loss += lm.item()
        if (step + 1) % 10 == 0:
            log(f"step {step + 1:4d}  train_loss {run_loss / 10:.4f}  indexer_kl {kl.item():.4f}  "
                f"lr {opt.param_groups[0]['lr']:.2e}  {time.time() - t0:6.0f}s")
            run_loss = 0.0
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == STEPS:
            model.eval()
            nll = heldout_nll(model, chunks)
            model.train()
            history.append({"step": step + 1, "heldout_nll": nll, "train_loss": lm.item(),
                            "seconds": time.time() - t0})
            log(f"step {step + 1:4d}  heldout_nll {nll:.4f}  ppl {math.exp(nll):.2f}")
    model.eval()
    return history


# ---- MTP block -------------------------------------------------------------------------------

class MTPBlock(nn.Module):
    """mtp.0: enorm(embed[t+1]) -> e_proj, hnorm(X_L[t]) per stream -> h_proj, summed, then one
    sliding-window MoE block, its own hc_head and norm, and the shared head; predicts token t+2."""

    def __init__(self, cfg: dict):
        super().__init__()
        from transformers import DeepseekV4ForCausalLM
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RMSNorm
        host = DeepseekV4ForCausalLM(hf_config(cfg, num_hidden_layers=1, compress_ratios=[0], num_hash_layers=0,
                                               vocab_size=128)).float()   # initialised block + hc_head
        d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.block, self.hc_head = host.model.layers[0], host.model.hc_head
        self.enorm, self.hnorm, self.norm = (DeepseekV4RMSNorm(d, eps) for _ in range(3))
        self.e_proj, self.h_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        for lin in (self.e_proj, self.h_proj):
            nn.init.normal_(lin.weight, std=cfg["initializer_range"])

    def forward(self, x_last: torch.Tensor, next_embed: torch.Tensor, layer_kwargs: dict) -> torch.Tensor:
        x = self.h_proj(self.hnorm(x_last)) + self.e_proj(self.enorm(next_embed)).unsqueeze(2)
        x = self.block(x, **{**layer_kwargs, "input_ids": None})
        return self.norm(self.hc_head(x))


def capture_last_residual(model) -> dict:
    """Forward hook on the last decoder layer: its output X_L (before hc_head) and its kwargs."""
    box: dict = {}

    def hook(mod, args, kwargs, out):
        box["x"], box["kwargs"] = out, {k: v for k, v in kwargs.items() if k != "input_ids"}
    model.model.layers[-1].register_forward_hook(hook, with_kwargs=True)
    return box


def mtp_logits(model, mtp: MTPBlock, box: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits at positions t = 0..S-3 for token t+2."""
    with torch.no_grad():
        model.model(input_ids=ids, use_cache=False)
        next_embed = model.model.embed_tokens(torch.cat([ids[:, 1:], ids[:, -1:]], 1))
    hidden = mtp(box["x"], next_embed, box["kwargs"])
    return model.lm_head(hidden)[:, :-2]


def train_mtp(model, cfg, stream, chunks, log) -> tuple[MTPBlock, list[dict]]:
    torch.manual_seed(SEED + 2)
    for p in model.parameters():
        p.requires_grad_(False)
    mtp = MTPBlock(cfg)
    box = capture_last_residual(model)
    balancer = RouterBalancer([mtp.block.mlp.gate], cfg["n_routed_experts"])
    opt = make_optimizer(mtp.named_parameters(), MTP_LR)
    gen = torch.Generator().manual_seed(SEED + 3)
    history, t0, run_loss = [], time.time(), 0.0
    for step in range(MTP_STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, MTP_STEPS, MTP_LR)
        ids = sample_batch(stream, gen, BATCH, SEQ_LEN)
        logits = mtp_logits(model, mtp, box, ids)
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 2:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        balancer.step(BIAS_UPDATE)
        run_loss += loss.item()
        if (step + 1) % 10 == 0:
            log(f"mtp step {step + 1:4d}  train_loss {run_loss / 10:.4f}  {time.time() - t0:6.0f}s")
            run_loss = 0.0
    with torch.no_grad():
        total, count = 0.0, 0
        for ids in chunks:
            if len(ids) < 3:
                continue
            logits = mtp_logits(model, mtp, box, ids[None])[0]
            total += F.cross_entropy(logits, ids[2:], reduction="sum").item()
            count += len(ids) - 2
    history.append({"step": MTP_STEPS, "heldout_nll_t+2": total / count, "seconds": time.time() - t0})
    log(f"mtp heldout_nll(t+2) {total / count:.4f}")
    return mtp, history


# ---- official names (via dsv4's one naming table) ------------------------------------------------

MTP_EXTRAS = {"e_proj.weight": "e_proj.weight", "h_proj.weight": "h_proj.weight", "enorm.weight": "enorm.weight",
              "hnorm.weight": "hnorm.weight", "norm.weight": "norm.weight", "hc_head.hc_fn": "hc_head_fn",
              "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}


def to_masters(model, mtp: MTPBlock | None) -> dict[str, torch.Tensor]:
    """Official-name fp32 masters; merged experts [E, 2I, D] split into per-expert w1/w3 (and w2)."""
    from dsv4.checkpoint.naming import official_from_transformers
    masters = dict(official_from_transformers((k, v.detach().clone()) for k, v in model.state_dict().items()))
    if mtp is not None:  # the MTP block is a decoder layer: convert it as layer 0, then rename
        block = ((f"layers.0.{k[len('block.'):]}", v.detach().clone())
                 for k, v in mtp.state_dict().items() if k.startswith("block."))
        masters.update({"mtp.0." + k[len("layers.0."):]: v for k, v in official_from_transformers(block)})
        masters.update({"mtp.0." + MTP_EXTRAS[k]: v.clone() for k, v in mtp.state_dict().items() if k in MTP_EXTRAS})
    return masters


def load_masters_into(model, mtp: MTPBlock | None, masters: dict[str, torch.Tensor]) -> None:
    """Inverse of `to_masters` (used by --eval to rebuild the fp32 transformers model)."""
    from dsv4.checkpoint.naming import official_to_transformers

    def state(names, rename) -> dict[str, torch.Tensor]:
        sd: dict[str, torch.Tensor] = {}
        experts: dict[str, dict] = {}
        for name in names:
            m = re.match(r"^(.*)\.ffn\.experts\.(\d+)\.(w[123])\.weight$", name)
            if m:
                experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = masters[name]
            else:
                sd[rename(name)] = masters[name]
        for block, w in experts.items():
            n = 1 + max(e for e, _ in w)
            tf = rename(f"{block}.ffn.gate.weight").replace("gate.weight", "experts.")
            sd[tf + "gate_up_proj"] = torch.stack([torch.cat([w[e, "w1"], w[e, "w3"]]) for e in range(n)])
            sd[tf + "down_proj"] = torch.stack([w[e, "w2"] for e in range(n)])
        return sd

    model.load_state_dict(state([n for n in masters if not n.startswith("mtp.")], official_to_transformers),
                          strict=True)
    if mtp is not None:
        extras = {"mtp.0." + v: k for k, v in MTP_EXTRAS.items()}
        block = [n for n in masters if n.startswith("mtp.0.") and n not in extras]
        sd = state(block, lambda n: "block." + official_to_transformers("layers.0." + n[len("mtp.0."):], False)
                   [len("layers.0."):])
        sd.update({v: masters[k] for k, v in extras.items()})
        mtp.load_state_dict(sd, strict=True)


# ---- files -----------------------------------------------------------------------------------

MASTERS_PATH = Path("/tmp/dsv4_tiny_master.safetensors")
HISTORY_PATH = Path("/tmp/dsv4_tiny_history.json")
LOG_PATH = Path("/tmp/dsv4_tiny_train.log")


def write_checkpoint_files(out: Path, cfg: dict, masters: dict[str, torch.Tensor]) -> None:
    from dsv4.checkpoint.writer import write_checkpoint
    from dsv4.config import ModelConfig
    write_checkpoint(out, ModelConfig.from_dict(cfg), masters, num_shards=2)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def write_tokenizer_files(out: Path, tok) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")


def greedy(next_logits, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        tok = int(next_logits(torch.tensor(ids)).argmax())
        ids.append(tok)
        if tok == EOS:
            break
    return ids[len(prompt):]


SAMPLE_PROMPTS = ["The following methods can be defined to", "A class definition", "If the exception"]


def evaluate(out: Path, log) -> dict:
    """Held-out perplexity of the fp32 masters (transformers), of the shipped quantized checkpoint
    re-loaded by transformers, and of the shipped checkpoint run by dsv4 (when dsv4.model exists)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import DeepseekV4ForCausalLM, FineGrainedFP8Config
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    _, held = load_corpus()
    chunks = eval_chunks(tok, list(held.values()))
    cfg = json.loads((out / "config.json").read_text())
    report: dict = {"heldout_topics": list(held), "heldout_tokens": sum(len(c) - 1 for c in chunks)}
    runners = {}

    masters = load_file(str(MASTERS_PATH))
    master = build_model(cfg, torch.Generator().manual_seed(0))
    mtp = MTPBlock(cfg)
    load_masters_into(master, mtp, masters)
    master.eval()
    runners["transformers, fp32 masters"] = lambda ids: master(input_ids=ids[None], use_cache=False).logits[0]

    quant, info = DeepseekV4ForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True,
        quantization_config=FineGrainedFP8Config(dequantize=True, expert_dtype="fp4", scale_fmt="ue8m0"))
    quant = quant.float().eval()
    bad = {k: [n for n in v if not n.startswith("mtp.")] for k, v in info.items() if v}
    if any(bad.values()):
        raise ValueError(f"transformers loading info not clean: {bad}")
    runners["transformers, shipped FP8/MXFP4 checkpoint (dequantized)"] = \
        lambda ids: quant(input_ids=ids[None], use_cache=False).logits[0]

    dsv4_models = {}
    try:
        import dsv4
        for numerics in ("reference", "transformers"):
            model = dsv4_models[numerics] = dsv4.load_model(out, numerics=numerics)
            runners[f"dsv4, shipped checkpoint, numerics={numerics}"] = \
                lambda ids, model=model: model.compute_logits(model.forward(ids, torch.arange(len(ids))))
    except (ImportError, AttributeError) as e:
        log(f"dsv4 model not available ({e}); skipping the dsv4 rows")

    report["perplexity"], report["samples"] = {}, {}
    with torch.no_grad():
        for name, run in runners.items():
            total, count = 0.0, 0
            for ids in chunks:
                total += F.cross_entropy(run(ids).float()[:-1], ids[1:], reduction="sum").item()
                count += len(ids) - 1
            report["perplexity"][name] = {"nll": total / count, "ppl": math.exp(total / count)}
            log(f"{name}: nll {total / count:.4f} ppl {math.exp(total / count):.2f}")
            report["samples"][name] = {p: tok.decode(greedy(lambda ids: run(ids)[-1], [BOS] + tok.encode(p).ids, 40))
                                       for p in SAMPLE_PROMPTS}
        box = capture_last_residual(master)
        report["mtp_heldout_nll_t+2"] = {"transformers, fp32 masters": mtp_nll(
            chunks, lambda ids: mtp_logits(master, mtp, box, ids[None])[0],
            lambda ids: master(input_ids=ids[None], use_cache=False).logits[0])}
        for numerics, model in dsv4_models.items():
            report["mtp_heldout_nll_t+2"][f"dsv4, numerics={numerics}"] = mtp_nll(
                chunks, lambda ids, m=model: dsv4_mtp_logits(m, ids),
                lambda ids, m=model: m.compute_logits(m.forward(ids, torch.arange(len(ids)))))
    report["files_bytes"] = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    report["total_bytes"] = sum(report["files_bytes"].values())
    return report


def dsv4_mtp_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """dsv4's MTP block on a whole chunk: X_L[t] + embed[t+1] at position t -> logits for t+2."""
    model.forward(ids, torch.arange(len(ids)))
    x = model.get_mtp_target_hidden_states()[:-1]
    _, hidden = model.forward_mtp(x, ids[1:], torch.arange(len(ids) - 1))
    return model.mtp[0].compute_logits(hidden)[:-1]


def mtp_nll(chunks, mtp_fn, main_fn) -> dict:
    """t+2 NLL of the MTP head, and how often its greedy draft equals the main model's next greedy token."""
    total, agree, count = 0.0, 0, 0
    for ids in chunks:
        if len(ids) < 3:
            continue
        draft = mtp_fn(ids).float()
        total += F.cross_entropy(draft, ids[2:], reduction="sum").item()
        agree += int((draft.argmax(-1) == main_fn(ids)[1:-1].argmax(-1)).sum())
        count += len(ids) - 2
    return {"nll": total / count, "draft_agrees_with_main_greedy": agree / count}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "dsv4" / "assets" / "tiny")
    ap.add_argument("--eval", action="store_true", help="only evaluate (needs the masters from a training run)")
    ap.add_argument("--write-only", action="store_true", help="skip training; write the checkpoint from the masters")
    ap.add_argument("--steps", type=int, default=None, help="override backbone steps (smoke tests)")
    ap.add_argument("--mtp-steps", type=int, default=None, help="override MTP steps (smoke tests)")
    args = ap.parse_args()
    global STEPS, MTP_STEPS
    STEPS = args.steps if args.steps is not None else STEPS
    MTP_STEPS = args.mtp_steps if args.mtp_steps is not None else MTP_STEPS
    torch.set_num_threads(1)
    logf = open(LOG_PATH, "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    if args.eval:
        report = evaluate(args.out, log)
        Path("/tmp/dsv4_tiny_eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return

    train, held = load_corpus()
    tok = train_tokenizer(list(train.values()))
    cfg = model_config(tok.get_vocab_size())
    if args.write_only:
        from safetensors.torch import load_file
        write_tokenizer_files(args.out, tok)
        write_checkpoint_files(args.out, cfg, load_file(str(MASTERS_PATH)))
        return

    t0, c0 = time.time(), time.process_time()
    log(f"held-out topics: {list(held)}")
    stream, chunks = token_stream(tok, list(train.values())), eval_chunks(tok, list(held.values()))
    log(f"train tokens {len(stream)}, held-out tokens {sum(len(c) - 1 for c in chunks)}, vocab {tok.get_vocab_size()}")
    torch.manual_seed(SEED)
    model = build_model(cfg, torch.Generator().manual_seed(SEED))
    log(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    history = train_backbone(model, cfg, stream, chunks, log)
    mtp, mtp_history = train_mtp(model, cfg, stream, chunks, log)
    log(f"training wall time {time.time() - t0:.0f}s, cpu time {time.process_time() - c0:.0f}s")

    from safetensors.torch import save_file
    masters = to_masters(model, mtp)
    save_file({k: v.contiguous() for k, v in masters.items()}, str(MASTERS_PATH))
    HISTORY_PATH.write_text(json.dumps({"backbone": history, "mtp": mtp_history,
                                        "wall_seconds": time.time() - t0,
                                        "cpu_seconds": time.process_time() - c0}, indent=2))
    write_tokenizer_files(args.out, tok)
    try:
        write_checkpoint_files(args.out, cfg, masters)
    except ImportError as e:
        log(f"dsv4 writer not available yet ({e}); masters saved to {MASTERS_PATH}; rerun with --write-only")


if __name__ == "__main__":
    main()
