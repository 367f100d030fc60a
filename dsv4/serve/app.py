"""The OpenAI-compatible HTTP app (FastAPI): routes, auth, limits, streaming.

Everything a client can get wrong is checked here and answered with a 4xx in the OpenAI error
shape; the engine only ever sees valid requests. Generation runs in `AsyncEngine`'s thread.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.async_engine import AsyncEngine, EngineOverloaded, EngineStopped
from ..engine.outputs import RequestOutput
from .chat_bridge import ChatBridge
from .metrics import ServerMetrics
from .protocol import (ChatCompletionRequest, CompletionRequest, error_body, new_id, now, usage)

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


@dataclass
class ServerConfig:
    model_name: str
    max_model_len: int
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int | None = None


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def create_app(engine: AsyncEngine, bridge: ChatBridge, cfg: ServerConfig) -> FastAPI:
    app = FastAPI(title="dsv4", version="0.1.0")
    metrics = ServerMetrics()
    app.state.engine, app.state.metrics, app.state.cfg = engine, metrics, cfg

    # ---- errors --------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError):
        metrics.rejected.labels(str(e.status)).inc()
        return JSONResponse(error_body(e.message, e.type, e.param, e.status), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        msg = f"{loc}: {first.get('msg', 'invalid request')}" if loc else first.get("msg", "invalid request")
        metrics.rejected.labels("400").inc()
        return JSONResponse(error_body(msg, param=loc, code=400), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        return JSONResponse(error_body(str(e.detail), code=e.status_code), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception):
        log.exception("internal error")
        return JSONResponse(error_body("internal server error", "server_error", code=500), status_code=500)

    # ---- auth, body size, draining -------------------------------------------------------
    @app.middleware("http")
    async def _guard(request: Request, call_next):
        path = request.url.path
        if cfg.api_key and path != "/health":
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), cfg.api_key.encode()):
                metrics.rejected.labels("401").inc()
                return JSONResponse(error_body("invalid or missing API key", "authentication_error", code=401),
                                    status_code=401)
        if request.method == "POST":
            if not engine.accepting:
                metrics.rejected.labels("503").inc()
                return JSONResponse(error_body("server is shutting down", "service_unavailable", code=503),
                                    status_code=503)
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > cfg.max_body_bytes):
                return JSONResponse(error_body(f"request body larger than {cfg.max_body_bytes} bytes", code=413),
                                    status_code=413)
        return await call_next(request)

    # ---- plain routes --------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if engine.error is not None or engine.step_overdue():
            return JSONResponse({"status": "unhealthy"}, status_code=503)
        return {"status": "ok" if engine.accepting else "draining"}

    @app.get("/metrics")
    async def prom():
        metrics.refresh(engine.stats(), engine.num_pending())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": cfg.model_name, "object": "model", "created": now(),
                                            "owned_by": "dsv4", "max_model_len": cfg.max_model_len}]}

    # ---- shared generation plumbing -----------------------------------------------------
    def check_model(name: str | None) -> None:
        if name is not None and name != cfg.model_name:
            raise ApiError(404, f"The model `{name}` does not exist.", "not_found_error", "model")

    def budget(prompt_len: int, max_tokens: int | None, what: str) -> int:
        if prompt_len == 0:
            raise ApiError(400, "prompt is empty", param="prompt")
        if max_tokens is None:
            max_tokens = cfg.default_max_tokens or max(cfg.max_model_len - prompt_len, 0)
        total = prompt_len + max_tokens
        if prompt_len >= cfg.max_model_len or total > cfg.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {cfg.max_model_len} tokens. "
                                f"However, you requested {total} tokens ({prompt_len} in the {what}, "
                                f"{max_tokens} in the completion). Please reduce the length of the "
                                f"{what} or completion.", param="max_tokens")
        return max_tokens

    async def stream_one(rid: str, ids: list[int], params) -> AsyncIterator[RequestOutput]:
        start = time.monotonic()
        last = None
        try:
            async for out in engine.generate(rid, ids, params):
                t = time.monotonic()
                if out.token_ids:
                    if last is None:
                        metrics.ttft.observe(t - start)
                    else:
                        metrics.itl.observe((t - last) / len(out.token_ids))
                    last = t
                    metrics.generation_tokens.inc(len(out.token_ids))
                if out.finished:
                    metrics.requests.labels(out.finish_reason or "unknown").inc()
                    metrics.e2e.observe(t - start)
                yield out
        except EngineOverloaded as e:
            raise ApiError(429, str(e), "rate_limit_error") from None
        except EngineStopped as e:
            raise ApiError(503, str(e), "service_unavailable") from None
        except ValueError as e:
            raise ApiError(400, str(e)) from None

    async def first_then_rest(gen: AsyncIterator[RequestOutput]):
        """Pull the first delta before answering, so admission errors become HTTP statuses."""
        try:
            first = await gen.__anext__()
        except StopAsyncIteration:
            first = None
        return first, gen

    async def collect(gen: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
        return [o async for o in gen]

    # ---- /v1/completions -----------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        check_model(req.model)
        prompts = bridge.completion_prompts(req.prompt)
        if req.echo and req.stream:
            raise ApiError(400, "echo is not supported with stream", param="echo")
        if req.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")
        jobs = []
        for p_i, ids in enumerate(prompts):
            max_tokens = budget(len(ids), req.max_tokens if req.max_tokens is not None else 16, "prompt")
            for k in range(req.n):
                params = bridge.sampling_params(req, max_tokens, logprobs=req.logprobs, k=k)
                jobs.append((p_i * req.n + k, ids, params))
        metrics.prompt_tokens.inc(sum(len(ids) for ids in prompts) * req.n)
        rid = new_id("cmpl")
        created = now()
        gens = [stream_one(f"{rid}-{i}", ids, params) for i, ids, params in jobs]
        firsts = await asyncio.gather(*(first_then_rest(g) for g in gens))

        def choice(i: int, text: str, outs: list[RequestOutput], finish: str | None) -> dict:
            lp = bridge.completion_logprobs(outs) if req.logprobs is not None else None
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}

        if not req.stream:
            results = []
            for (i, ids, _), (first, gen) in zip(jobs, firsts):
                outs = ([first] if first else []) + await collect(gen)
                text = "".join(o.text for o in outs)
                if req.echo:
                    text = bridge.decode(ids) + text
                results.append((i, text, outs))
            n_out = sum(o[-1].completion_tokens for _, _, o in results if o)
            n_in = sum(len(ids) for _, ids, _ in jobs)
            return {"id": rid, "object": "text_completion", "created": created, "model": cfg.model_name,
                    "choices": [choice(i, text, outs, outs[-1].finish_reason if outs else "abort")
                                for i, text, outs in results],
                    "usage": usage(n_in, n_out)}

        async def events():
            queue: asyncio.Queue = asyncio.Queue()
            done = object()

            async def pump(i: int, first, gen):
                try:
                    if first is not None:
                        await queue.put((i, first))
                        async for o in gen:
                            await queue.put((i, o))
                finally:
                    await queue.put((i, done))

            tasks = [asyncio.create_task(pump(i, f, g)) for (i, _, _), (f, g) in zip(jobs, firsts)]
            remaining, n_out = len(tasks), {}
            try:
                while remaining:
                    i, o = await queue.get()
                    if o is done:
                        remaining -= 1
                        continue
                    n_out[i] = o.completion_tokens
                    yield _sse({"id": rid, "object": "text_completion", "created": created, "model": cfg.model_name,
                                "choices": [choice(i, o.text, [o], o.finish_reason if o.finished else None)]})
                if req.stream_options and req.stream_options.include_usage:
                    n_in = sum(len(ids) for _, ids, _ in jobs)
                    yield _sse({"id": rid, "object": "text_completion", "created": created,
                                "model": cfg.model_name, "choices": [], "usage": usage(n_in, sum(n_out.values()))})
                yield b"data: [DONE]\n\n"
            finally:
                for t in tasks:
                    t.cancel()

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- /v1/chat/completions ------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest):
        check_model(req.model)
        try:
            rendered = bridge.render_chat(req)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        ids = rendered.token_ids
        max_tokens = budget(len(ids), req.max_completion_tokens or req.max_tokens, "messages")
        top = req.top_logprobs if req.logprobs else None
        if req.logprobs and top is None:
            top = 0
        jobs = [(k, bridge.sampling_params(req, max_tokens, logprobs=top, k=k)) for k in range(req.n)]
        metrics.prompt_tokens.inc(len(ids) * req.n)
        rid = new_id("chatcmpl")
        created = now()
        gens = [stream_one(f"{rid}-{k}", ids, params) for k, params in jobs]
        firsts = await asyncio.gather(*(first_then_rest(g) for g in gens))
        base = {"id": rid, "created": created, "model": cfg.model_name}

        if not req.stream:
            choices, n_out = [], 0
            for (k, _), (first, gen) in zip(jobs, firsts):
                outs = ([first] if first else []) + await collect(gen)
                n_out += outs[-1].completion_tokens if outs else 0
                parsed = rendered.parse("".join(o.text for o in outs))
                finish = outs[-1].finish_reason if outs else "abort"
                if parsed.get("tool_calls") and finish == "stop":
                    finish = "tool_calls"
                msg = {"role": "assistant", "content": parsed.get("content"),
                       "reasoning_content": parsed.get("reasoning_content")}
                if parsed.get("tool_calls"):
                    msg["tool_calls"] = parsed["tool_calls"]
                lp = bridge.chat_logprobs(outs) if req.logprobs else None
                choices.append({"index": k, "message": msg, "logprobs": lp, "finish_reason": finish})
            return {**base, "object": "chat.completion", "choices": choices,
                    "usage": usage(len(ids) * req.n, n_out)}

        async def events():
            queue: asyncio.Queue = asyncio.Queue()
            done = object()

            async def pump(k: int, first, gen):
                try:
                    if first is not None:
                        await queue.put((k, first))
                        async for o in gen:
                            await queue.put((k, o))
                finally:
                    await queue.put((k, done))

            tasks = [asyncio.create_task(pump(k, f, g)) for (k, _), (f, g) in zip(jobs, firsts)]
            parsers = {k: rendered.stream_parser() for k, _ in jobs}
            saw_tool = {k: False for k, _ in jobs}
            n_out: dict[int, int] = {}
            remaining = len(tasks)
            try:
                for k, _ in jobs:
                    yield _sse({**base, "object": "chat.completion.chunk",
                                "choices": [{"index": k, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]})
                while remaining:
                    k, o = await queue.get()
                    if o is done:
                        remaining -= 1
                        continue
                    n_out[k] = o.completion_tokens
                    deltas = parsers[k].feed(o.text)
                    if o.finished:
                        deltas += parsers[k].finish()
                    lp = bridge.chat_logprobs([o]) if req.logprobs else None
                    for d in deltas:
                        saw_tool[k] |= "tool_calls" in d
                        yield _sse({**base, "object": "chat.completion.chunk",
                                    "choices": [{"index": k, "delta": d, "logprobs": lp, "finish_reason": None}]})
                        lp = None
                    if o.finished:
                        finish = o.finish_reason
                        if saw_tool[k] and finish == "stop":
                            finish = "tool_calls"
                        yield _sse({**base, "object": "chat.completion.chunk",
                                    "choices": [{"index": k, "delta": {}, "logprobs": lp,
                                                 "finish_reason": finish}]})
                if req.stream_options and req.stream_options.include_usage:
                    yield _sse({**base, "object": "chat.completion.chunk", "choices": [],
                                "usage": usage(len(ids) * req.n, sum(n_out.values()))})
                yield b"data: [DONE]\n\n"
            finally:
                for t in tasks:
                    t.cancel()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
