"""The OpenAI-compatible HTTP app (FastAPI): routes, limits, streaming.

Everything a client can get wrong is checked here (or in protocol.py / chat_bridge.py) and
answered with a 4xx in the OpenAI error shape; the engine only ever sees valid requests.
Generation runs in `AsyncEngine`'s thread. A request's sequences (n choices, several prompts) are
admitted together or not at all; a client that goes away aborts them, which frees their pages.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine.async_engine import AsyncEngine, EngineOverloaded, EngineStopped, RequestStream
from ..engine.outputs import RequestOutput
from .chat_bridge import ChatBridge, RenderedChat, RequestError
from .guard import Guard
from .metrics import ServerMetrics
from .protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, error_body,
                       error_body_for, new_id, now, usage)
from .response_store import ResponseStore
from .messages import add_messages_route
from .responses import Plumbing, add_responses_route

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param
        self.code = status if code is None else code


@dataclass
class ServerConfig:
    model_name: str
    max_model_len: int
    # more ids clients may send (`--served-model-name a b`); /v1/models lists them all, replies echo the one sent
    model_aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    completion_default_max_tokens: int = 16   # OpenAI's default for /v1/completions
    responses_store: int = 256   # /v1/responses kept for previous_response_id (dsv4.serve.response_store); 0: off
    allowed_origins: tuple[str, ...] = ()  # CORS: browser origins allowed to call the API ("*": any); (): none


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class _StreamWithAbort(StreamingResponse):
    """Aborts its engine requests however the response ends: finished, client gone, cancelled,
    or never started (a client that leaves before the first byte)."""

    def __init__(self, content, streams: list[RequestStream]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for s in self.streams:
                s.abort()


class _Observer:
    """Latency and token metrics of one sequence, fed with its deltas."""

    def __init__(self, metrics: ServerMetrics, start: float):
        self.metrics, self.start, self.last = metrics, start, None

    def __call__(self, out: RequestOutput) -> None:
        t = time.monotonic()
        if out.token_ids:
            if self.last is None:
                self.metrics.ttft.observe(t - self.start)
            else:
                self.metrics.itl.observe((t - self.last) / len(out.token_ids))
            self.last = t
            self.metrics.generation_tokens.inc(len(out.token_ids))
        if out.finished:
            self.metrics.requests.labels(out.finish_reason or "unknown").inc()
            self.metrics.e2e.observe(t - self.start)


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, delta) pairs of several streams, in arrival order."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for out in s:
                await q.put((i, out))
            await q.put((i, None))
        except BaseException as e:   # handed to the consumer, which re-raises it
            await q.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await q.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: AsyncEngine, bridge: ChatBridge, cfg: ServerConfig,
               metrics: ServerMetrics | None = None):
    """The ASGI app: FastAPI routes wrapped in the auth / draining / body-size guard (and, with allowed origins,
    CORS around it)."""
    app = FastAPI(title="dsv4", version="0.1.0", docs_url=None, redoc_url=None)
    metrics = metrics or ServerMetrics()
    engine.on_step = metrics.step.observe
    app.state.engine, app.state.metrics, app.state.cfg = engine, metrics, cfg

    # ---- errors: the OpenAI shape (the Messages API's on its routes), never a 500 for bad input ----
    def error_response(request: Request, status: int, message: str, type_: str = "invalid_request_error",
                       param: str | None = None, code: str | int | None = None) -> JSONResponse:
        metrics.rejected.labels(str(status)).inc()
        return JSONResponse(error_body_for(request.url.path, status, message, type_, param, code), status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(request, e.status, e.message, e.type, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        errors = e.errors()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        msg = str(first.get("msg", "invalid request"))
        if loc is None and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
            msg = "the request body must be a JSON object (Content-Type: application/json)"
        return error_response(request, 400, f"{loc}: {msg}" if loc else msg, param=loc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        return error_response(request, e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.exception("internal error")
        return error_response(request, 500, "internal server error", "server_error")

    # ---- plain routes --------------------------------------------------------------------
    @app.get("/health")
    async def health():
        ok, reason = engine.health()
        return JSONResponse({"status": reason}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prom():
        metrics.refresh(engine.stats(), engine.num_pending())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    names = (cfg.model_name, *cfg.model_aliases)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": now(), "owned_by": "dsv4",
                "max_model_len": cfg.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(n) for n in names]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        return model_card(check_model(name))

    @app.get("/version")
    async def version():
        return {"version": __version__}

    # ---- vLLM's token utilities ----------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", param="prompt")
        try:
            ids = (bridge.completion_prompts(req.prompt)[0] if req.prompt is not None
                   else bridge.render_chat(req).token_ids)
        except RequestError as e:
            raise ApiError(400, str(e), param=e.param) from None
        return {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        tok = bridge.tokenizer
        if tok is None:
            raise ApiError(404, "this model has no tokenizer", "not_found_error")
        return {"tokenizer_class": "dsv4", "bos_token": tok.id_to_token(tok.bos_id),
                "eos_token": tok.id_to_token(tok.eos_id), "pad_token": None, "model_max_length": cfg.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        check_model(req.model)
        try:
            bridge.check_ids(req.tokens, "tokens")
        except RequestError as e:
            raise ApiError(400, str(e), param=e.param) from None
        if bridge.tokenizer is None:
            raise ApiError(400, "detokenize needs a tokenizer, and this model has none", param="tokens")
        return {"prompt": bridge.decode(req.tokens)}

    # ---- shared generation plumbing -----------------------------------------------------
    def check_model(name: str | None) -> str:
        """The id a reply names: the one the request sent (the first served name when it sent none)."""
        if name is None:
            return cfg.model_name
        if name not in names:
            raise ApiError(404, f"The model `{name}` does not exist.", "not_found_error", "model",
                           "model_not_found")
        return name

    def budget(prompt_len: int, max_tokens: int | None, what: str) -> int:
        if prompt_len == 0:
            raise ApiError(400, f"the {what} is empty", param=what)
        requested = max_tokens if max_tokens is not None else max(cfg.max_model_len - prompt_len, 0)
        if prompt_len >= cfg.max_model_len or prompt_len + requested > cfg.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {cfg.max_model_len} tokens. "
                                f"However, you requested {prompt_len + requested} tokens ({prompt_len} in the "
                                f"{what}, {requested} in the completion). Please reduce the length of the "
                                f"{what} or completion.", param=what, code="context_length_exceeded")
        return requested

    async def admit(jobs: list[tuple[list[int], Any]], prefix: str) -> tuple[str, list[RequestStream]]:
        """Submit all sequences of one request; map refusals to HTTP statuses."""
        rid = new_id(prefix)
        try:
            streams = engine.submit([(f"{rid}-{i}", ids, params) for i, (ids, params) in enumerate(jobs)])
        except EngineOverloaded as e:
            raise ApiError(429, str(e), "rate_limit_error", code=429) from None
        except EngineStopped as e:
            raise ApiError(503, str(e), "service_unavailable", code=503) from None
        try:
            for s in streams:
                await s.accepted()
        except BaseException as e:
            for s in streams:
                s.abort()
            if isinstance(e, ValueError):
                raise ApiError(400, str(e)) from None
            if isinstance(e, EngineStopped):
                raise ApiError(503, str(e), "service_unavailable") from None
            raise
        metrics.prompt_tokens.inc(sum(len(ids) for ids, _ in jobs))
        for _, params in jobs:
            if params.structured is not None:
                metrics.structured.labels(params.structured.kind).inc()
        return rid, streams

    async def collect(request: Request, streams: list[RequestStream]) -> list[list[RequestOutput]]:
        """All deltas of every stream; a client that disconnects meanwhile aborts them."""
        start = time.monotonic()

        async def run(s: RequestStream) -> list[RequestOutput]:
            observe, outs = _Observer(metrics, start), []
            async for out in s:
                observe(out)
                outs.append(out)
            return outs

        work = asyncio.ensure_future(asyncio.gather(*(run(s) for s in streams)))
        gone = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()
            raise ApiError(499, "client disconnected", code=499)
        except EngineStopped as e:
            raise ApiError(503, str(e), "service_unavailable") from None
        finally:
            for f in (work, gone):
                f.cancel()
            for s in streams:
                s.abort()

    def error_event(e: BaseException) -> bytes:
        if isinstance(e, EngineStopped):
            return _sse(error_body(str(e), "service_unavailable", code=503))
        log.error("stream failed: %r", e)
        return _sse(error_body("internal server error", "server_error", code=500))

    # ---- /v1/completions -----------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        model = check_model(req.model)
        if req.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise ApiError(400, "best_of is not supported (ask for n choices instead)", param="best_of")
        score_only = req.max_tokens == 0  # the prompt's logprobs only: the engine's one sampled token is dropped
        if score_only and not req.echo:
            raise ApiError(400, "max_tokens must be >= 1 (0 only with echo: the prompt scored, nothing generated)",
                           param="max_tokens")
        try:
            prompts = bridge.completion_prompts(req.prompt)
            max_tokens = 1 if score_only else (req.max_tokens if req.max_tokens is not None
                                               else cfg.completion_default_max_tokens)
            so = bridge.structured_output(req)
            jobs = []
            for ids in prompts:
                budget(len(ids), max_tokens, "prompt")
                for k in range(req.n):
                    jobs.append((ids, bridge.sampling_params(req, max_tokens, logprobs=req.logprobs, k=k,
                                                             prompt_logprobs=req.logprobs if req.echo else None,
                                                             structured=so)))
        except RequestError as e:
            raise ApiError(400, str(e), param=e.param) from None
        rid, streams = await admit(jobs, "cmpl")
        created, n_in = now(), sum(len(ids) for ids in prompts)   # a prompt counts once, whatever n
        echoes = [bridge.decode(ids) if req.echo else "" for ids, _ in jobs]
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}

        def choice(i: int, text: str, outs: list[RequestOutput], finish: str | None, offset: int = 0) -> dict:
            lp = bridge.completion_logprobs(outs, offset, jobs[i][0]) if req.logprobs is not None else None
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}

        def shown(o: RequestOutput) -> RequestOutput:
            if not score_only:
                return o
            return replace(o, token_ids=[], text="", logprobs=None, completion_tokens=0,
                           finish_reason="length" if o.finished else None)

        if not req.stream:
            results = [[shown(o) for o in outs] for outs in await collect(request, streams)]
            choices = [choice(i, echoes[i] + "".join(o.text for o in outs), outs, outs[-1].finish_reason)
                       for i, outs in enumerate(results)]
            n_out = sum(outs[-1].completion_tokens for outs in results)
            cached = [outs[-1].cached_tokens for outs in results]
            return {**head, "choices": choices, "usage": usage(n_in, n_out, cached, req.n)}

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def events() -> AsyncIterator[bytes]:
            start = time.monotonic()
            observers = [_Observer(metrics, start) for _ in streams]
            n_out, offsets, unfinished = [0] * len(streams), [0] * len(streams), len(streams)
            cached = [0] * len(streams)
            # echo: the prompt's text first; with logprobs it waits for the first output (its logprobs come with it)
            held = list(echoes) if req.logprobs is not None else [""] * len(echoes)
            for i, text in enumerate(echoes):
                if text and not held[i]:
                    offsets[i] = len(text)
                    yield _sse({**head, "choices": [choice(i, text, [], None)]})
            try:
                async for i, o in _merge(streams):
                    observers[i](o)
                    o = shown(o)
                    n_out[i], cached[i] = o.completion_tokens, o.cached_tokens
                    text, held[i] = held[i] + o.text, ""
                    chunk = {**head, "choices": [choice(i, text, [o], o.finish_reason, offsets[i])]}
                    offsets[i] += len(text)
                    unfinished -= o.finished
                    if unfinished == 0 and not include_usage:
                        chunk["usage"] = usage(n_in, sum(n_out), cached, req.n)
                    yield _sse(chunk)
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": usage(n_in, sum(n_out), cached, req.n)})
            except Exception as e:
                yield error_event(e)
            yield SSE_DONE

        return _StreamWithAbort(events(), streams)

    # ---- /v1/chat/completions ------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        model = check_model(req.model)
        try:
            rendered = bridge.render_chat(req)
            ids = rendered.token_ids
            max_tokens = budget(len(ids), req.max_completion_tokens or req.max_tokens, "messages")
            top = (req.top_logprobs or 0) if req.logprobs else None
            so = bridge.structured_output(req, rendered)
            jobs = [(ids, bridge.sampling_params(req, max_tokens, logprobs=top, k=k, structured=so,
                                                 retain_prefix=rendered.retain_prefix)) for k in range(req.n)]
        except RequestError as e:
            raise ApiError(400, str(e), param=e.param) from None
        rid, streams = await admit(jobs, "chatcmpl")
        head = {"id": rid, "created": now(), "model": model}
        n_in = len(ids)

        if not req.stream:
            results = await collect(request, streams)
            return {**head, "object": "chat.completion",
                    "choices": [_chat_choice(k, outs, rendered, bridge if req.logprobs else None)
                                for k, outs in enumerate(results)],
                    "usage": usage(n_in, sum(outs[-1].completion_tokens for outs in results),
                                   [outs[-1].cached_tokens for outs in results], req.n)}

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunk_head = {**head, "object": "chat.completion.chunk"}

        def chunk(k: int, delta: dict, lp: dict | None = None, finish: str | None = None) -> dict:
            return {**chunk_head, "choices": [{"index": k, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        async def events() -> AsyncIterator[bytes]:
            start = time.monotonic()
            observers = [_Observer(metrics, start) for _ in streams]
            parsers = [rendered.stream_parser() for _ in streams]
            saw_tool = [False] * len(streams)
            n_out, unfinished = [0] * len(streams), len(streams)
            cached = [0] * len(streams)
            for k in range(len(streams)):
                yield _sse(chunk(k, {"role": "assistant", "content": ""}))
            try:
                async for k, o in _merge(streams):
                    observers[k](o)
                    n_out[k], cached[k] = o.completion_tokens, o.cached_tokens
                    deltas = parsers[k].feed(o.text)
                    if o.finished:
                        deltas += parsers[k].finish()
                    lp = bridge.chat_logprobs([o]) if req.logprobs and o.logprobs else None
                    if lp is not None and not deltas:
                        deltas = [{}]   # text held back by the parser: the logprobs still go out now
                    for d in deltas:
                        saw_tool[k] |= "tool_calls" in d
                        yield _sse(chunk(k, d, lp))
                        lp = None
                    if o.finished:
                        unfinished -= 1
                        finish = "tool_calls" if saw_tool[k] and o.finish_reason == "stop" else o.finish_reason
                        last = chunk(k, {}, None, finish)
                        if unfinished == 0 and not include_usage:
                            last["usage"] = usage(n_in, sum(n_out), cached, req.n)
                        yield _sse(last)
                if include_usage:
                    yield _sse({**chunk_head, "choices": [], "usage": usage(n_in, sum(n_out), cached, req.n)})
            except Exception as e:
                yield error_event(e)
            yield SSE_DONE

        return _StreamWithAbort(events(), streams)

    # ---- /v1/responses (dsv4.serve.responses), /v1/messages (dsv4.serve.messages) ---------
    plumbing = Plumbing(
        bridge, check_model, budget, admit, collect, error_event,
        observer=lambda start: _Observer(metrics, start), streaming=_StreamWithAbort,
        api_error=lambda e: ApiError(400, str(e), param=e.param),
        not_found=lambda message: ApiError(404, message, "not_found_error"),
        store=ResponseStore(cfg.responses_store) if cfg.responses_store else None)
    add_responses_route(app, plumbing)
    add_messages_route(app, plumbing)

    guarded = Guard(app, api_key=cfg.api_key, max_body_bytes=cfg.max_body_bytes,
                    is_accepting=lambda: engine.accepting,
                    on_reject=lambda status: metrics.rejected.labels(str(status)).inc())
    if not cfg.allowed_origins:
        return guarded
    # outside the guard: a browser's preflight (OPTIONS, no API key) is answered here, and every answer, a 401 too,
    # carries the headers the browser needs to show it to the page
    return CORSMiddleware(guarded, allow_origins=list(cfg.allowed_origins), allow_methods=["GET", "POST", "DELETE"],
                          allow_headers=["Authorization", "Content-Type"], max_age=600)


def _chat_choice(k: int, outs: list[RequestOutput], rendered: RenderedChat, bridge: ChatBridge | None) -> dict:
    parsed = rendered.parse("".join(o.text for o in outs))
    finish = outs[-1].finish_reason
    msg: dict[str, Any] = {"role": "assistant", "content": parsed["content"],
                           "reasoning_content": parsed["reasoning_content"]}
    if parsed["tool_calls"]:
        msg["tool_calls"] = parsed["tool_calls"]
        if finish == "stop":
            finish = "tool_calls"
    lp = bridge.chat_logprobs(outs) if bridge is not None else None
    return {"index": k, "message": msg, "logprobs": lp, "finish_reason": finish}
