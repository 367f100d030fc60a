"""Asyncio front of an engine core: one worker thread runs `core.step()`; coroutines submit and stream.

Why a thread: a step is a blocking torch call (CPU or GPU). Running it on the event loop would stall
every HTTP connection, so the loop only moves requests and deltas across thread-safe queues, and
only the worker thread ever touches the core (it is not thread-safe).

Public API
----------
AsyncEngine(core, *, max_running=256, max_queued=256, step_watchdog_s=120.0)
    .start() / .shutdown()        worker thread; shutdown ends every stream with finish_reason "abort"
    .submit([(id, prompt_ids, params), ...]) -> [RequestStream]   all or nothing (event-loop thread)
        EngineOverloaded when running + queued would exceed max_running + max_queued (-> 429),
        EngineStopped while draining, stalled or failed (-> 503), ValueError for a duplicate id.
    .generate(id, prompt_ids, params)   async iterator over one request's deltas (convenience)
    .accepting, .num_pending(), .stats(), .health() -> (ok, reason), .on_step(seconds) hook
RequestStream
    await .accepted()   wait until the core took the request; re-raises its ValueError (-> 400)
    async for out in stream   RequestOutput deltas until one has finished=True
    .abort()            stop the request and free its cache pages (idempotent; no-op once finished)

Watchdog: a step running longer than `step_watchdog_s` marks the engine stalled (health 503, new
requests 503), fails the requests in flight and logs the worker's stack; it recovers when the
step returns. A step that raises fails its requests and leaves the engine failed for good.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
import traceback
from typing import AsyncIterator, Callable, Protocol

from .outputs import EngineStats, RequestOutput, aborted_output

log = logging.getLogger(__name__)


class EngineCore(Protocol):
    max_model_len: int

    def add_request(self, request_id: str, prompt_token_ids: list[int], params) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished(self) -> bool: ...
    def stats(self) -> EngineStats: ...


class EngineOverloaded(RuntimeError):
    """Admission refused: too many running + queued requests (-> HTTP 429)."""


class EngineStopped(RuntimeError):
    """The engine is draining, stalled, failed or stopped (-> HTTP 503)."""


_ACCEPTED = object()   # first item of every stream once the core has the request


class RequestStream:
    def __init__(self, engine: "AsyncEngine", request_id: str, prompt_token_ids: list[int], params):
        self.engine = engine
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.finished = False
        self._queue: asyncio.Queue = asyncio.Queue()
        self._accepted = False
        self._early: RequestOutput | None = None   # an "abort" delta that beat the acceptance

    async def accepted(self) -> None:
        if self._accepted:
            return
        item = await self._queue.get()
        self._accepted = True
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if isinstance(item, RequestOutput):   # ended (shutdown) before the core took it
            self._early = item

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._accepted:
            await self.accepted()
        if self._early is not None:
            item, self._early = self._early, None
        elif self.finished:
            raise StopAsyncIteration
        else:
            item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, core: EngineCore, *, max_running: int = 256, max_queued: int = 256,
                 step_watchdog_s: float = 120.0):
        if max_running < 1 or max_queued < 0:
            raise ValueError(f"AsyncEngine: max_running={max_running} must be >= 1, max_queued={max_queued} >= 0")
        self.core = core
        self.capacity = max_running + max_queued
        self.step_watchdog_s = step_watchdog_s
        self.on_step: Callable[[float], None] | None = None
        self.accepting = True
        self.error: BaseException | None = None
        self.stalled = False
        self.step_started: float | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[RequestStream, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stats = core.stats()

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, name="dsv4-engine", daemon=True),
                         threading.Thread(target=self._watchdog, name="dsv4-watchdog", daemon=True)]
        for t in self._threads:
            t.start()

    def shutdown(self) -> None:
        """Stop accepting, end every open stream with an "abort" delta, stop the worker."""
        self.accepting = False
        with self._lock:
            ids = list(self._streams)
        for rid in ids:
            self._fail(rid, None)
            self._inbox.put(("abort", rid))
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []

    # ---- state -------------------------------------------------------------------------
    def num_pending(self) -> int:
        """Requests submitted and not yet finished or aborted in the core."""
        with self._lock:
            return len(self._streams)

    def stats(self) -> EngineStats:
        return self._stats

    def step_overdue(self) -> bool:
        started = self.step_started
        return started is not None and time.monotonic() - started > self.step_watchdog_s

    def health(self) -> tuple[bool, str]:
        if self.error is not None:
            return False, f"engine failed: {self.error}"
        if self.stalled or self.step_overdue():
            return False, f"engine step running longer than {self.step_watchdog_s:g}s"
        if self._threads and not self._threads[0].is_alive():
            return False, "engine thread is not running"
        return True, "ok" if self.accepting else "draining"

    # ---- requests ----------------------------------------------------------------------
    def submit(self, requests: list[tuple[str, list[int], object]]) -> list[RequestStream]:
        """Admit all requests or none. Call on the event loop that will consume the streams."""
        if not self.accepting:
            raise EngineStopped("server is shutting down")
        ok, reason = self.health()
        if not ok:
            raise EngineStopped(reason)
        loop = asyncio.get_running_loop()
        streams = [RequestStream(self, rid, ids, params) for rid, ids, params in requests]
        with self._lock:
            for s in streams:
                if s.request_id in self._streams:
                    raise ValueError(f"duplicate request id {s.request_id}")
            if len(self._streams) + len(streams) > self.capacity:
                raise EngineOverloaded(f"the server is at capacity ({self.capacity} requests running or "
                                       f"queued); retry later")
            for s in streams:
                self._streams[s.request_id] = (s, loop)
        for s in streams:
            self._inbox.put(("add", s))
        self._wake.set()
        return streams

    async def generate(self, request_id: str, prompt_token_ids: list[int], params) -> AsyncIterator[RequestOutput]:
        """Submit one request and yield its deltas; leaving the loop early aborts it."""
        (stream,) = self.submit([(request_id, prompt_token_ids, params)])
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    # ---- worker side -------------------------------------------------------------------
    def _deliver(self, items: list[tuple[str, object]]) -> None:
        """Hand (request id, item) pairs to their event loops: one wake-up per loop per call."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        with self._lock:
            for rid, item in items:
                entry = self._streams.get(rid)
                if entry is None:
                    continue   # aborted or failed meanwhile
                stream, loop = entry
                if isinstance(item, BaseException) or (isinstance(item, RequestOutput) and item.finished):
                    del self._streams[rid]
                by_loop.setdefault(loop, []).append((stream, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:   # that loop is closed: nobody is listening any more
                pass

    def _fail(self, rid: str, error: BaseException | None) -> None:
        """End a stream now (error, or an "abort" delta when None); the core is told separately."""
        entry = self._streams.get(rid)
        if entry is not None:
            n_prompt = len(entry[0].prompt_token_ids)
            self._deliver([(rid, error if error is not None else aborted_output(rid, n_prompt))])

    def _drain_inbox(self) -> None:
        delivered = []
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                with self._lock:
                    live = arg.request_id in self._streams
                if not live:
                    continue   # aborted before the core saw it
                try:
                    self.core.add_request(arg.request_id, arg.prompt_token_ids, arg.params)
                    delivered.append((arg.request_id, _ACCEPTED))
                except Exception as e:  # the core's validation: fails that request only
                    delivered.append((arg.request_id, e if isinstance(e, ValueError) else ValueError(str(e))))
            else:
                with self._lock:
                    self._streams.pop(arg, None)
                try:
                    self.core.abort_request(arg)
                except Exception:
                    log.exception("abort of %s failed", arg)
        if delivered:
            self._deliver(delivered)

    def _run(self) -> None:
        while True:
            self._drain_inbox()
            if self._stop.is_set():
                return
            if self.error is not None or not self.core.has_unfinished():
                self._stats = self.core.stats()
                self._wake.wait(timeout=0.1)
                self._wake.clear()
                continue
            self.step_started = time.monotonic()
            try:
                outputs = self.core.step()
            except Exception as e:  # a failing step fails its requests, never the process
                log.exception("engine step failed; the engine now refuses requests")
                self.error = e
                with self._lock:
                    ids = list(self._streams)
                for rid in ids:
                    self._fail(rid, EngineStopped(f"engine step failed: {e}"))
                continue
            finally:
                elapsed = time.monotonic() - self.step_started
                self.step_started = None
                self.stalled = False
                if self.on_step is not None:
                    self.on_step(elapsed)
            # stats first: a client that sees its request finish (and /metrics no request in flight) must also
            # see the pages the step freed (the other order left a window of stale page counts)
            self._stats = self.core.stats()
            self._deliver([(out.request_id, out) for out in outputs])

    def _watchdog(self) -> None:
        period = min(1.0, self.step_watchdog_s / 4)
        reported: float | None = None
        while not self._stop.wait(period):
            started = self.step_started
            if started is None or not self.step_overdue() or reported == started:
                continue
            reported = started
            self.stalled = True
            frame = sys._current_frames().get(self._threads[0].ident) if self._threads else None
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(unavailable)"
            log.error("engine step running for %.1fs (watchdog %gs); failing in-flight requests. "
                      "Worker stack:\n%s", time.monotonic() - started, self.step_watchdog_s, stack)
            with self._lock:
                ids = list(self._streams)
            for rid in ids:
                self._fail(rid, EngineStopped(f"engine step exceeded the {self.step_watchdog_s:g}s watchdog"))
                self._inbox.put(("abort", rid))   # the core drops them once the step returns


def _put_all(batch: list[tuple[RequestStream, object]]) -> None:
    for stream, item in batch:
        stream._queue.put_nowait(item)
