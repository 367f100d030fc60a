"""`make demo`: generate text with the tiny DeepSeek-V4 model shipped inside the package."""
from __future__ import annotations

import sys
import time

PROMPTS = ["The for statement", "A class definition", "Exceptions are"]


def main() -> int:
    import dsv4
    from dsv4.engine.assets import default_model_path

    path = default_model_path()
    print(f"dsv4 demo: embedded model {path} (FP8 linears + MXFP4 experts), CPU", flush=True)
    llm = dsv4.LLM()
    params = dsv4.SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=48)
    start = time.perf_counter()
    results = llm.generate(PROMPTS, params)
    took = time.perf_counter() - start
    for prompt, r in zip(PROMPTS, results):
        print(f"\n>>> {prompt}\n{prompt}{r.text}")
    n = sum(len(r.token_ids) for r in results)
    print(f"\n[{len(PROMPTS)} prompts batched, {n} tokens in {took:.1f}s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
