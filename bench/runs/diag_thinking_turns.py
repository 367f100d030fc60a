"""Session 58 diagnostic: where the retained and fresh thinking / tool turns' greedy tokens part (test_engine_gpu's
thinking-turns test failed on the H200 at token 32), and the fresh run's margin between its two best tokens there."""

from dsv4 import LLM, SamplingParams

kw = dict(device="cuda", kv_dtype="fp8", cuda_graphs=True)
for thinking in (True, False):
    fresh, keeping = LLM(**kw), LLM(retain_finished=2, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2)
    tools = None if thinking else [{"type": "function", "function": {"name": "look", "parameters": {
        "type": "object", "properties": {}}}}]
    history = [{"role": "system", "content": "You answer questions about Python briefly."}]
    for turn, line in enumerate(("The for statement", "And the while statement?", "What about classes?")):
        history.append({"role": "user", "content": line})
        got = keeping.chat(history, params, thinking=thinking, tools=tools)[0]
        want = fresh.chat(history, params, thinking=thinking, tools=tools)[0]
        j = next((i for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids)) if a != b), None)
        eos = [i for i, t in enumerate(want.token_ids) if t == keeping.tokenizer.eos_id] if hasattr(
            keeping.tokenizer, "eos_id") else "?"
        line_out = f"thinking={thinking} turn={turn} cached={got.cached_tokens} prompt={len(got.prompt_token_ids)} " \
                   f"part at {j} eos at {eos}"
        if j is not None:
            top_w = want.logprobs[j].top[:2]
            top_g = got.logprobs[j].top[:2]
            line_out += f" fresh top2 {top_w} kept top2 {top_g}"
        print(line_out, flush=True)
        history.append({"role": "assistant", "content": got.content or "", "reasoning_content": got.reasoning_content})
