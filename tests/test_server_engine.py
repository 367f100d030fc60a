"""The engine side of the server, in process: OutputTracker text rules against a brute-force
reference, and AsyncEngine admission / abort / shutdown / failure behaviour on the fake core."""
from __future__ import annotations

import asyncio
import random

import pytest

from dsv4.chat.encoding import EOS
from dsv4.engine.async_engine import AsyncEngine, EngineOverloaded, EngineStopped
from dsv4.engine.outputs import OutputTracker
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.sequence import Sequence
from fake_engine import COUNTING, FakeCore, write_tokenizer

REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def reference_text(tok, out_ids: list[int], stops: list[str], eos: int, stop_ids: set[int]) -> tuple[str, str]:
    """Brute force: grow the output token by token; stop at EOS / stop id (token not shown) or at the
    first prefix whose full decode contains a stop string (text cut before the earliest match)."""
    for n in range(1, len(out_ids) + 1):
        if out_ids[n - 1] == eos or out_ids[n - 1] in stop_ids:
            return tok.decode(out_ids[:n - 1]), "stop"
        text = tok.decode(out_ids[:n])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return text[:min(hits)], "stop"
    return tok.decode(out_ids), "length"


@pytest.mark.parametrize("seed", range(40))
def test_output_tracker_text_matches_reference(tok, seed):
    rng = random.Random(seed)
    pool = ["Grüße 😀 你好 café ½", " 1 2 3 4", "abc abd abe", EOS, "ok ok"]
    text = "".join(rng.choice(pool) for _ in range(6))
    out_ids = tok.encode(text)
    if rng.random() < 0.3:   # cut a multi-byte character in the middle now and then
        out_ids = out_ids + tok.encode("😀")[:1]
    decoded = tok.decode(out_ids)
    stops = []
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(len(decoded))
        stops.append(decoded[i:i + rng.randint(1, 4)].replace(REPLACEMENT, "") or "zz")
    stops = [s for s in stops if s]
    stop_ids = {rng.choice(out_ids)} if rng.random() < 0.2 else set()
    params = SamplingParams(temperature=0, stop=stops, stop_token_ids=sorted(stop_ids), max_tokens=len(out_ids))
    prompt = tok.encode("prompt: ")
    seq = Sequence("r", prompt, params)
    tracker = OutputTracker("r", prompt, params, tok)
    deltas, final = [], None
    for t in out_ids:
        seq.append_token(t)
        seq.check_stop({tok.eos_id}, 10_000, tok.decode)
        out = tracker.update(seq, [t])
        deltas.append(out.text)
        assert REPLACEMENT not in out.text or REPLACEMENT in tok.decode(out_ids)
        if out.finished:
            final = out
            break
    want_text, want_reason = reference_text(tok, out_ids, stops, tok.eos_id, stop_ids)
    assert "".join(deltas) == want_text
    assert final is not None and final.finish_reason == want_reason
    assert final.completion_tokens == len(deltas)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_abort_mid_stream_frees_pages(tok):
    core = FakeCore(tok, max_model_len=512, max_num_seqs=8)

    async def main():
        engine = AsyncEngine(core, max_running=8, max_queued=0)
        engine.start()
        try:
            total = core.stats().total_pages
            streams = engine.submit([(f"r{i}", tok.encode(f"count {i}"), SamplingParams(temperature=0, max_tokens=400))
                                     for i in range(4)])
            got = {s.request_id: "" for s in streams}
            for s in streams[:2]:
                async for out in s:
                    got[s.request_id] += out.text
                    if len(got[s.request_id]) > 10:
                        s.abort()
                        break
            assert core.stats().free_pages < total
            async for out in streams[2]:
                got["r2"] += out.text
            streams[3].abort()
            for _ in range(200):
                if engine.num_pending() == 0 and core.stats().free_pages == total:
                    break
                await asyncio.sleep(0.01)
            assert core.stats().free_pages == total and engine.num_pending() == 0
            assert got["r2"] == tok.decode(tok.encode(COUNTING)[:400])
            assert COUNTING.startswith(got["r0"]) and len(got["r0"]) < len(got["r2"])
        finally:
            engine.shutdown()
    run(main())


def test_submit_is_all_or_nothing(tok):
    core = FakeCore(tok, max_num_seqs=2, step_delay=0.01)

    async def main():
        engine = AsyncEngine(core, max_running=2, max_queued=1)
        engine.start()
        try:
            params = SamplingParams(temperature=0, max_tokens=50)
            engine.submit([("a", [5, 6], params), ("b", [5, 7], params)])
            with pytest.raises(EngineOverloaded):
                engine.submit([("c", [5], params), ("d", [6], params)])
            assert engine.num_pending() == 2
            (c,) = engine.submit([("c", [5], params)])
            with pytest.raises(ValueError, match="duplicate"):
                engine.submit([("a", [5], params)])
            await c.accepted()
            engine.shutdown()
            outs = [o async for o in c]
            assert outs[-1].finished and outs[-1].finish_reason == "abort"
            with pytest.raises(EngineStopped):
                engine.submit([("e", [5], params)])
        finally:
            engine.shutdown()
    run(main())


def test_core_rejection_and_failing_step(tok):
    core = FakeCore(tok, max_model_len=64)

    async def main():
        engine = AsyncEngine(core, max_running=4, max_queued=4)
        engine.start()
        try:
            (s,) = engine.submit([("long", list(range(3, 70)), SamplingParams(max_tokens=1))])
            with pytest.raises(ValueError, match="max_model_len"):
                await s.accepted()
            ok, _ = engine.health()
            assert ok

            def broken_step():
                raise RuntimeError("device lost")
            core.step = broken_step
            (s,) = engine.submit([("x", [5, 6], SamplingParams(max_tokens=4))])
            with pytest.raises(EngineStopped, match="device lost"):
                async for _ in s:
                    pass
            ok, reason = engine.health()
            assert not ok and "device lost" in reason
            with pytest.raises(EngineStopped):
                engine.submit([("y", [5], SamplingParams(max_tokens=1))])
        finally:
            engine.shutdown()
    run(main())


@pytest.mark.parametrize("args,message", [
    (["--port", "70000"], "--port"),
    (["--max-queued", "-1"], "--max-queued"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--api-key", " "], "--api-key"),
    (["--step-watchdog", "0"], "--step-watchdog"),
    (["--retain-finished", "-1"], "--retain-finished"),
    (["--prefix-snapshots", "-1"], "--prefix-snapshots"),
    (["--prefix-snapshots", "2", "--no-share-prompts"], "drop --no-share-prompts"),
    (["--responses-store", "-1"], "--responses-store"),
    (["--allowed-origins", "https://ok.example,ftp//bad"], "'ftp//bad' is not an origin"),
])
def test_serve_cli_rejects_bad_options_before_loading(args, message, capsys):
    from dsv4.cli import main
    assert main(["serve", "--model", "/nonexistent", *args]) == 1
    err = capsys.readouterr().err
    assert "dsv4 serve: error:" in err and message in err
