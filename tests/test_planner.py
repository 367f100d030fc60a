"""Memory planner: Flash on one H200 does not fit, on two it does, with numbers re-derived here from
the expected inventory, the spec's cache arithmetic (deepseek_v4_model.md §3.2) and the engine's
pool layout; and the per-rank weight bytes equal what a sharded model really allocates."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dsv4.checkpoint.naming import expected_inventory
from dsv4.checkpoint.writer import tiny_config
from dsv4.config import ModelConfig
from dsv4.engine.paged_state import cache_bytes_per_token
from dsv4.planner import GPU_MEMORY, parse_memory, plan, rank_weight_bytes

FLASH_JSON = Path("/work/shared/fixtures/configs/deepseek-v4-flash.config.json")
needs_flash = pytest.mark.skipif(not FLASH_JSON.is_file(), reason=f"{FLASH_JSON} not found")
H200 = 143771 * 2 ** 20     # nvidia-smi's total for an H200
FLASH_TOTAL = 159_609_485_896  # checkpoint_format.md §4: Flash metadata.total_size (incl. MTP)


@pytest.fixture(scope="module")
def flash() -> ModelConfig:
    return ModelConfig.from_file(FLASH_JSON)


def halved_by_tp2(name: str) -> bool:
    """Tensors split in two by --tp 2 (docs/parallel.md): vocab, attention heads/groups, shared expert."""
    return bool(re.search(r"(^embed\.|^head\.|attn\.(wq_b|wo_a|wo_b)\.|attn\.attn_sink$|shared_experts\.)", name))


def flash_rank0_bytes(cfg: ModelConfig) -> int:
    """Rank 0 of tp=2, ep=2: experts 0..E/2-1 only; the TP-split tensors (and their scales) halved."""
    total = 0
    for name, spec in expected_inventory(cfg).items():
        m = re.search(r"\.experts\.(\d+)\.", name)
        if m and int(m.group(1)) >= cfg.n_routed_experts // 2:
            continue
        total += spec.nbytes // 2 if halved_by_tp2(name) else spec.nbytes
    return total


def fixed_state_bytes(cfg: ModelConfig, entry: int, acc_bytes: int, max_rollback: int = 4) -> int:
    """Engine pools (dsv4.engine.paged_state): a window ring of window + max_rollback entries per
    layer incl. MTP; per compressed layer raw (C, Z) rows of the open window, the previous one,
    rollback slack and (CSA) one more window: 2r + rollback (+ r), each (c*512 [+ 2*128]) wide."""
    ring = (cfg.num_layers + 1) * (cfg.window + max_rollback) * entry
    state = 0
    for r in cfg.compress_ratios[: cfg.num_layers]:
        if r == 128:
            state += (2 * r + max_rollback) * cfg.head_dim * acc_bytes * 2
        elif r == 4:
            state += (3 * r + max_rollback) * (2 * cfg.head_dim + 2 * cfg.index_head_dim) * acc_bytes * 2
    return ring + state


@needs_flash
def test_flash_does_not_fit_one_h200(flash):
    p = plan(flash, gpus=1, gpu_memory=H200)
    assert p.weights == FLASH_TOTAL == sum(s.nbytes for s in expected_inventory(flash).values())
    assert not p.fits and p.cache_tokens == 0 and "weights need" in p.reason
    assert not plan(flash, gpus=1, gpu_memory=parse_memory("141GB"), utilization=1.0).fits


@needs_flash
@pytest.mark.parametrize("kv_dtype,per_token,entry", [("auto", 6880.0, 1024), ("fp8", 3514.25, 584)])
def test_flash_fits_two_h200(flash, kv_dtype, per_token, entry):
    p = plan(flash, gpus=2, gpu_memory=H200, kv_dtype=kv_dtype)
    assert (p.tp, p.ep) == (2, 2)
    weights = flash_rank0_bytes(flash)
    assert p.weights == weights and 75e9 < weights < 85e9
    assert p.cache_bytes_per_token == per_token == sum(cache_bytes_per_token(flash, kv_dtype).values())
    fixed = fixed_state_bytes(flash, entry, acc_bytes=4)
    assert p.fixed_per_sequence == fixed
    tokens = (int(H200 * 0.9) - weights - 64 * fixed) // per_token
    assert p.fits and p.cache_tokens == tokens and tokens > 5_000_000
    # experts replicated (tp 2, ep 1) do not fit; pure EP does, with less room than TP + EP
    assert not plan(flash, gpus=2, gpu_memory=H200, tp=2, ep=1).fits
    ep_only = plan(flash, gpus=2, gpu_memory=H200, tp=1, ep=2, kv_dtype=kv_dtype)
    assert ep_only.fits and ep_only.cache_tokens < p.cache_tokens


@pytest.mark.parametrize("tp,ep,rank", [(2, 2, 0), (2, 2, 1), (1, 2, 1), (2, 4, 3)])
def test_weight_bytes_equal_a_sharded_model(tp, ep, rank):
    """Build the rank's model (meta tensors) and count what it allocates."""
    from dsv4.model import DeepseekV4ForCausalLM
    cfg = tiny_config("fp4", "sliding,csa,hca", moe_intermediate_size=256)
    ps = SimpleNamespace(tp=tp, ep=ep, rank=rank)  # the layout needs no process group to size a model
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(cfg, torch.bfloat16, parallel=ps)
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    want = rank_weight_bytes(cfg, tp, ep, rank, weight_format="dequantized", dtype=torch.bfloat16)
    assert held == sum(want.values())
    assert sum(want.values()) < sum(rank_weight_bytes(cfg, 1, 1, 0, weight_format="dequantized").values())


def test_parse_memory():
    assert parse_memory("h200") == GPU_MEMORY["h200"] == H200
    assert parse_memory("141GB") == parse_memory("141") == 141 * 10 ** 9
    assert parse_memory("139.5GiB") == int(139.5 * 2 ** 30)
    for bad in ("lots", "12 TB", ""):
        with pytest.raises(ValueError, match="gpu-memory"):
            parse_memory(bad)


def test_rejects_layouts_that_do_not_match_the_gpus():
    cfg = tiny_config("fp4")
    with pytest.raises(ValueError, match="runs on 2 GPUs"):
        plan(cfg, gpus=4, gpu_memory=H200, tp=2, ep=2)
    with pytest.raises(ValueError, match="num_attention_heads"):
        plan(cfg, gpus=8, gpu_memory=H200)
