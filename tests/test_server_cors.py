"""`dsv4 serve --allowed-origins`: CORS for browser clients, on the fake engine core (fake_engine.py).

A browser sends a preflight (OPTIONS, no API key) before a cross-origin POST with an Authorization header, and shows
a response to the page only when it carries Access-Control-Allow-Origin for the page's origin. Checked: the
preflight of an allowed origin is answered (without the key), another origin's is refused, real answers (a 401
too) carry the header for allowed origins only, and a server without the option sends no CORS headers at all."""
from __future__ import annotations

import httpx
import pytest

from fake_engine import ServerProcess, write_tokenizer

KEY = "sk-cors"
UI = "https://ui.example"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(d)
    logs = tmp_path_factory.mktemp("logs")
    with_cors = ServerProcess(d, logs / "cors.log", "--api-key", KEY,
                              "--allowed-origins", f"{UI}, http://localhost:3000")
    without = ServerProcess(d, logs / "plain.log", "--api-key", KEY)
    yield with_cors, without
    for srv in (with_cors, without):
        assert srv.stop() == 0 and "Traceback" not in srv.log(), srv.log()


def preflight(base: str, origin: str) -> httpx.Response:
    return httpx.options(base + "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_allowed_origins_get_cors_headers(servers):
    srv, _ = servers
    r = preflight(srv.base_url, UI)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == UI
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert preflight(srv.base_url, "http://localhost:3000").status_code == 200
    other = preflight(srv.base_url, "https://evil.example")
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ok = httpx.post(srv.base_url + "/v1/chat/completions", json=body,
                    headers={"Origin": UI, "Authorization": f"Bearer {KEY}"}, timeout=60)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == UI and ok.json()["choices"]
    denied = httpx.post(srv.base_url + "/v1/chat/completions", json=body, headers={"Origin": UI}, timeout=60)
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == UI
    foreign = httpx.get(srv.base_url + "/v1/models", headers={"Origin": "https://evil.example",
                                                               "Authorization": f"Bearer {KEY}"})
    assert foreign.status_code == 200 and "access-control-allow-origin" not in foreign.headers


def test_no_cors_headers_without_the_option(servers):
    _, srv = servers
    r = preflight(srv.base_url, UI)
    assert r.status_code in (401, 405) and "access-control-allow-origin" not in r.headers
    ok = httpx.get(srv.base_url + "/v1/models", headers={"Origin": UI, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and "access-control-allow-origin" not in ok.headers
