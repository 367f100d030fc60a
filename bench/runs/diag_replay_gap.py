"""Session 59 diagnosis: why a decode step's graph takes longer inside the engine's loop than replayed back to back
(8 Flash layers, B = 1, prompt 4096, H100/H200). Times the same captured graph four ways, each by CUDA events around
the replay alone: back to back; inside engine steps; back to back with L2 flushed before each (as the LM head's
1 GB read does); back to back with new random ids before each (other experts, other hash routes)."""
import os
import statistics
import sys
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import dsv4.model.graphs as graphs  # noqa: E402
from bench_engine_step import _model  # noqa: E402


def timed(fn, before=None, reps=30):
    out = []
    for _ in range(reps):
        if before:
            before()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def main():
    args = types.SimpleNamespace(layers=8, batches="1", smoke=False, speculative=0)
    model, cfg = _model(args)
    from dsv4.engine.cache import CacheConfig
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.sampling_params import SamplingParams
    longest = 4096 + 200
    pools = CacheConfig.for_capacity(cfg, max_num_seqs=1, max_model_len=longest, total_tokens=longest, kv_dtype="fp8")
    engine = LLMEngine(model, cfg, None, EngineConfig(max_num_seqs=1, max_num_batched_tokens=8192,
                                                      max_model_len=longest, cache=pools, overlap=True))
    g = torch.Generator().manual_seed(1)
    engine.add_request("r", torch.randint(2, cfg.vocab_size, (4096,), generator=g).tolist(),
                       SamplingParams(temperature=0.0, max_tokens=190, ignore_eos=True))
    for _ in range(8):
        engine.step()
    in_loop, orig = [], graphs._launch

    def launch(bucket):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        orig(bucket)
        e.record()
        in_loop.append((s, e))
    graphs._launch = launch
    for _ in range(40):
        engine.step()
    torch.cuda.synchronize()
    graphs._launch = orig
    loop_ms = statistics.median(s.elapsed_time(e) for s, e in in_loop[5:])
    bucket = model._graphs._last
    gr = bucket.graphs[0]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    def new_ids():
        with torch.inference_mode():  # the engine's buffers are inference tensors
            bucket.ids.random_(2, cfg.vocab_size)
    rows = [("inside engine steps", loop_ms),
            ("back to back", timed(gr.replay)),
            ("L2 flushed before each", timed(gr.replay, flush.zero_)),
            ("new random ids before each", timed(gr.replay, new_ids)),
            ("new ids + L2 flushed", timed(gr.replay, lambda: (new_ids(), flush.zero_())))]
    w = torch.randn(cfg.vocab_size, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(1, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    rows.append(("LM head alone (1 row)", timed(lambda: h @ w.t())))
    print(f"{torch.cuda.get_device_name()}: one decode step's graph, 8 layers, B=1, ctx≈4096; ms (median)")
    for name, ms in rows:
        print(f"{name:32s} {ms:.3f}")


if __name__ == "__main__":
    main()
