"""Admission (429), the step watchdog, and SIGTERM draining, on real server processes whose fake model
is slowed down (--step-delay) so requests stay in flight long enough to observe."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from fake_engine import COUNTING, ServerProcess, write_tokenizer

STEP = 0.03          # seconds per engine step
SLOTS, QUEUE = 2, 2  # --max-num-seqs, --max-queued


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizer")
    return d, write_tokenizer(d)


def start(tok, tmp_path_factory, *args: str) -> ServerProcess:
    log = tmp_path_factory.mktemp("server") / "server.log"
    return ServerProcess(tok[0], log, "--max-model-len", "256", "--max-num-seqs", str(SLOTS),
                         "--max-queued", str(QUEUE), "--step-delay", str(STEP), "--pages-per-seq", "16", *args)


async def metrics(client: httpx.AsyncClient) -> dict[str, float]:
    out = {}
    for line in (await client.get("/metrics")).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def wait_until(client: httpx.AsyncClient, pred, timeout: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = await metrics(client)
        if pred(m):
            return m
        assert time.monotonic() < deadline, f"timed out; metrics {m}"
        await asyncio.sleep(0.05)


async def stream(client: httpx.AsyncClient, prompt: str, max_tokens: int, *, stop_after: int | None = None):
    """(status, text, finish_reason) of a streamed completion; stop_after: leave after that many chunks."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.json(), None
        text, finish, seen = "", None, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text += chunk["choices"][0]["text"]
            finish = chunk["choices"][0]["finish_reason"] or finish
            seen += 1
            if stop_after is not None and seen >= stop_after:
                break
        return 200, text, finish


def counting(tok, n: int) -> str:
    return tok[1].decode(tok[1].encode(COUNTING)[:n])


@pytest.fixture(scope="module")
def server(tok, tmp_path_factory):
    srv = start(tok, tmp_path_factory, "--step-watchdog", "1", "--stall-seconds", "3", "--shutdown-timeout", "15")
    yield srv
    srv.kill()


def test_watchdog_fails_stalled_requests_and_recovers(server, tok):
    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            stalled = asyncio.create_task(c.post("/v1/completions", json={"prompt": "[stall] now", "max_tokens": 3}))
            t0 = time.monotonic()
            unhealthy = False
            while time.monotonic() - t0 < 2.5 and not unhealthy:
                unhealthy = (await c.get("/health")).status_code == 503
                await asyncio.sleep(0.05)
            r = await stalled
            assert unhealthy
            assert r.status_code == 503 and "watchdog" in r.json()["error"]["message"], r.text
            assert time.monotonic() - t0 < 2.5          # failed by the watchdog, before the step ended
            refused = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert refused.status_code == 503
            while (await c.get("/health")).status_code != 200:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.05)
            ok = await c.post("/v1/completions", json={"prompt": "count", "max_tokens": 3, "temperature": 0})
            assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == counting(tok, 3)
            m = await wait_until(c, lambda m: m["dsv4_num_requests_in_flight"] == 0)
            assert m["dsv4_cache_free_pages"] == m["dsv4_cache_total_pages"]
    asyncio.run(run())


def test_admission_is_all_or_nothing_and_429_beyond_capacity(server):
    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            holders = [asyncio.create_task(stream(c, f"hold {i}", 200)) for i in range(SLOTS + QUEUE)]
            # The scheduler runs SLOTS of them and queues the rest (its gauges lag by up to one step).
            await wait_until(c, lambda m: m["dsv4_num_requests_in_flight"] == SLOTS + QUEUE and
                             m["dsv4_num_requests_running"] == SLOTS and m["dsv4_num_requests_waiting"] == QUEUE)
            for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 2}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
                r = await c.post(path, json=body)
                assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", r.text
            holders[0].cancel()   # one client leaves: its slot frees up
            await wait_until(c, lambda m: m["dsv4_num_requests_in_flight"] == SLOTS + QUEUE - 1)
            r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 2})
            assert r.status_code == 429                 # n=2 does not fit one slot: nothing admitted
            assert (await metrics(c))["dsv4_num_requests_in_flight"] == SLOTS + QUEUE - 1
            r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 200
            for h in holders[1:]:
                h.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            m = await wait_until(c, lambda m: m["dsv4_num_requests_in_flight"] == 0)
            assert m["dsv4_cache_free_pages"] == m["dsv4_cache_total_pages"]
            assert m['dsv4_rejected_requests_total{status="429"}'] == 3
    asyncio.run(run())


def test_sigterm_drains_in_flight_and_refuses_new(server, tok):
    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            n = 30
            tasks = [asyncio.create_task(stream(c, f"drain {i}", n)) for i in range(SLOTS + 1)]
            await wait_until(c, lambda m: m["dsv4_generation_tokens_total"] > 0 and
                             m["dsv4_num_requests_in_flight"] == SLOTS + 1)
            server.signal(signal.SIGTERM)
            t0 = time.monotonic()
            await asyncio.sleep(0.2)
            r = await c.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
            health = await c.get("/health")
            assert health.json() == {"status": "draining"}
            results = await asyncio.gather(*tasks)
            assert results == [(200, counting(tok, n), "length")] * (SLOTS + 1)
            rc = await asyncio.to_thread(server.wait, 20)
            return rc, time.monotonic() - t0
    rc, elapsed = asyncio.run(run())
    print(f"\nSIGTERM with {SLOTS + 1} in flight: exit {rc} after {elapsed:.2f}s")
    assert rc == 0 and elapsed < 15, server.log()
    assert "Traceback" not in server.log(), server.log()


def test_sigterm_timeout_aborts_leftovers_and_exits(tok, tmp_path_factory):
    srv = start(tok, tmp_path_factory, "--shutdown-timeout", "1")
    try:
        async def run():
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c:
                tasks = [asyncio.create_task(stream(c, f"long {i}", 200)) for i in range(SLOTS)]
                await wait_until(c, lambda m: m["dsv4_generation_tokens_total"] > 0)
                srv.signal(signal.SIGTERM)
                t0 = time.monotonic()
                results = await asyncio.gather(*tasks)
                rc = await asyncio.to_thread(srv.wait, 20)
                return results, rc, time.monotonic() - t0
        results, rc, elapsed = asyncio.run(run())
        assert rc == 0 and elapsed < 1 + 6, srv.log()
        for status, text, finish in results:
            assert status == 200 and finish == "abort"
            assert text and counting(tok, 200).startswith(text) and text != counting(tok, 200)
    finally:
        srv.kill()


def test_bound_socket_accepts_connections_before_the_server_runs():
    """The URL is printed before uvicorn's accept loop starts: the socket must already listen, so that a client
    connecting in between is queued, not refused (a refused connection made test_server_fuzz's setup flaky)."""
    import socket

    from dsv4.serve.server import bind_socket
    sock = bind_socket("127.0.0.1", 0)
    try:
        clients = [socket.create_connection(sock.getsockname()[:2], timeout=5) for _ in range(3)]
        accepted = [sock.accept()[0] for _ in clients]  # what the accept loop will find queued, in order
        for i, (c, a) in enumerate(zip(clients, accepted)):
            c.sendall(bytes([i]))
            assert a.recv(1) == bytes([i])
            c.close()
            a.close()
    finally:
        sock.close()
