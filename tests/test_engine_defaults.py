"""Session 59: the fast path is the default on a GPU. `LLM` / `LLMEngine.from_pretrained` / the CLI leave
`cuda_graphs` and `kv_dtype` at None, which resolve where the model lands: on a GPU with the Triton kernels the
decode steps are CUDA graphs and the cache is FP8 (lossless under the reference numerics), on the CPU eager steps
over a cache in the model dtype. Across --tp/--ep ranks graphs stay opt-in. The GPU side (defaults equal to the
explicit fast path, and the same greedy text as eager steps over a bf16 cache) is
tests/gpu/test_engine_gpu.py::test_gpu_defaults_are_graphs_and_the_fp8_cache."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsv4.engine.llm_engine import default_kv_dtype, graphs_by_default
from dsv4.model.numerics import NUMERICS


def _placed(device: str, numerics: str = "reference", kernels: str = "triton"):
    """What the two rules read of a model: its parameters' device, numerics and kernels."""
    param = SimpleNamespace(device=torch.device(device))
    return SimpleNamespace(parameters=lambda: iter([param]), numerics=NUMERICS[numerics], kernels=kernels)


@pytest.mark.parametrize("device,numerics,kernels,kv,graphs", [
    ("cuda", "reference", "triton", "fp8", True),
    ("cuda", "transformers", "triton", "auto", True),  # its KV is not FP8-rounded: FP8 storage would round it
    ("cuda", "reference", "torch", "fp8", False),  # graphs need the Triton kernels (no host read-backs)
    ("cpu", "reference", "torch", "auto", False),
    ("cpu", "reference", "triton", "auto", False),  # Triton's interpreter on the CPU: no graphs there
])
def test_the_defaults_follow_the_device_numerics_and_kernels(device, numerics, kernels, kv, graphs):
    model = _placed(device, numerics, kernels)
    assert default_kv_dtype(model) == kv and graphs_by_default(model) is graphs


def test_llm_on_the_cpu_keeps_eager_steps_and_the_model_dtype_cache():
    from dsv4 import LLM, SamplingParams
    llm = LLM(device="cpu")
    assert llm.engine.cache.cache_config.kv_dtype == "auto" and llm.engine.model._graphs is None
    assert not llm.engine.overlap
    r = llm.generate("def add(a, b):", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert len(r.token_ids) == 4
    # asking is still honoured: the FP8 cache on the CPU (torch's reference path reads it)
    fp8 = LLM(device="cpu", kv_dtype="fp8")
    assert fp8.engine.cache.cache_config.kv_dtype == "fp8"
    # serve's startup line: the resolved settings, and the cache's bytes (FP8 stores the KV in fewer)
    assert llm.engine.describe().startswith("cpu float32, cache auto ")
    assert llm.engine.describe().endswith(", CUDA graphs off, overlap off")
    assert fp8.engine.cache.pools.nbytes() < llm.engine.cache.pools.nbytes()
    spec = LLM(device="cpu", speculative="mtp", num_draft_tokens=2).engine.describe()
    assert spec.endswith(", CUDA graphs off, overlap off, MTP drafting 2 per step")
    window = llm.engine.cache.pools.window
    assert llm.engine.cache.pools.nbytes() > sum(t.numel() * t.element_size() for p in window.values()
                                                 for t in p.tensors())


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_cli_leaves_both_to_the_device_unless_given(command):
    from dsv4.cli import build_parser
    parse = build_parser().parse_args
    extra = ["hi"] if command == "generate" else []
    default = parse([command, *extra])
    assert default.cuda_graphs is None and default.kv_dtype is None
    off = parse([command, "--no-cuda-graphs", "--kv-dtype", "auto", *extra])
    assert off.cuda_graphs is False and off.kv_dtype == "auto"
    assert parse([command, "--cuda-graphs", *extra]).cuda_graphs is True



def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. "
                                 "GPU 0 has a total capacity of 139 GiB\nof which ...")


def test_a_cache_that_does_not_fit_is_a_clear_error(monkeypatch):
    """The GPU running out of memory while the cache is made: a ValueError naming the options that size it and
    `dsv4 plan` (the CLI prints it as one line), not torch's traceback."""
    import dsv4.engine.llm_engine as llm_engine
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    model = LLMEngine.from_pretrained(device="cpu").model
    monkeypatch.setattr(llm_engine, "HybridCache", _oom)
    with pytest.raises(ValueError, match=r"the cache \(--cache-tokens 9000, 4 sequences of up to 4096 tokens, kv auto\)"
                                         r" does not fit in the GPU's memory: lower --cache-tokens.*dsv4 plan.*"
                                         r"Tried to allocate 20.00 GiB\. GPU 0 has a total capacity of 139 GiB$"):
        LLMEngine(model, model.config, None, EngineConfig(max_num_seqs=4, max_model_len=4096, cache_tokens=9000))


def test_weights_that_do_not_fit_are_a_clear_error_in_one_line(monkeypatch, capsys):
    import dsv4
    from dsv4.cli import main
    monkeypatch.setattr(dsv4, "load_model", _oom)
    assert main(["generate", "--device", "cpu", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("dsv4 generate: error: ") and "the weights do not fit in the GPU's memory: `dsv4 plan " in err
    assert "--gpus N` says how many GPUs they need (then --tp/--ep). CUDA out of memory." in err
