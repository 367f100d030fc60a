"""ASGI middleware in front of every route: API key, draining (503) and request body size (413).

Every POST route takes JSON, so a POST body is read as JSON whatever its Content-Type says
(`curl -d` sends application/x-www-form-urlencoded).

Pure ASGI rather than a BaseHTTPMiddleware, so streaming responses and client-disconnect
detection pass through untouched. The body of a POST is read here, bounded, and replayed to the
app; after it, `receive` is the server's own again (the app waits on it to see a disconnect).
"""
from __future__ import annotations

import hmac
import json
import re
from typing import Awaitable, Callable

from .protocol import error_body_for

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
PUBLIC_PATHS = frozenset({"/health"})
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def has_lone_surrogate(body: bytes) -> bool:
    """Whether a JSON body escapes an unpaired UTF-16 surrogate ("\\ud800"): json.loads accepts it, but
    the string is not Unicode text and would fail later in the tokenizer or the response encoder."""
    if not _SURROGATE_ESCAPE.search(body):
        return False
    try:
        json.dumps(json.loads(body), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):
        return False   # not JSON at all: the app answers that
    return False


async def send_json(send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class Guard:
    def __init__(self, app, *, api_key: str | None, max_body_bytes: int, is_accepting: Callable[[], bool],
                 on_reject: Callable[[int], None] = lambda status: None):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.is_accepting = is_accepting
        self.on_reject = on_reject

    async def _reject(self, scope: Scope, send: Send, status: int, message: str, type_: str, code: str | int
                      ) -> None:
        self.on_reject(status)
        headers = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        await send_json(send, status, error_body_for(scope["path"], status, message, type_, None, code), headers)

    def _authorized(self, scope: Scope) -> bool:
        """`Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's)."""
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                token = value[7:].strip()
            elif name == b"x-api-key":
                token = value.strip()
            else:
                continue
            if hmac.compare_digest(token, self.api_key):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_key is not None and scope["path"] not in PUBLIC_PATHS and not self._authorized(scope):
            await self._reject(scope, send, 401, "Incorrect or missing API key; send 'Authorization: Bearer <key>' "
                                                 "(or 'x-api-key: <key>')",
                               "authentication_error", "invalid_api_key")
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if not self.is_accepting():
            await self._reject(scope, send, 503, "The server is shutting down", "service_unavailable", 503)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_body_bytes):
                await self._reject(scope, send, 413, f"Request body larger than {self.max_body_bytes} bytes",
                                   "invalid_request_error", 413)
                return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._reject(scope, send, 413, f"Request body larger than {self.max_body_bytes} bytes",
                                   "invalid_request_error", 413)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if has_lone_surrogate(body):
            await self._reject(scope, send, 400, "The request contains an unpaired UTF-16 surrogate escape; strings "
                                                 "must be valid Unicode", "invalid_request_error", 400)
            return
        headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
        scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
