"""Asyncio front of the engine: one worker thread runs `LLMEngine.step()`; coroutines submit and stream.

Why a thread: a step is a blocking torch call (CPU or GPU). Running it on the event loop would stall
every HTTP connection, so the loop only moves requests and deltas across thread-safe queues.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Protocol

from .outputs import EngineStats, RequestOutput

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
    """The engine is draining or stopped (-> HTTP 503)."""


@dataclass
class _Submit:
    request_id: str
    prompt_token_ids: list[int]
    params: object
    out: asyncio.Queue
    loop: asyncio.AbstractEventLoop


class AsyncEngine:
    def __init__(self, core: EngineCore, *, max_pending: int = 1024, step_watchdog_s: float = 60.0):
        self.core = core
        self.max_pending = max_pending
        self.step_watchdog_s = step_watchdog_s
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, _Submit] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.accepting = True
        self.step_started: float | None = None
        self.last_step_s = 0.0
        self.stalled = False
        self.error: BaseException | None = None
        self._stats = core.stats()

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dsv4-engine", daemon=True)
            self._thread.start()

    def num_pending(self) -> int:
        with self._lock:
            return len(self._streams)

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting; wait for in-flight requests up to `timeout_s`. True if all finished."""
        self.accepting = False
        deadline = time.monotonic() + timeout_s
        while self.num_pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.num_pending() == 0

    def shutdown(self) -> None:
        self.accepting = False
        with self._lock:
            ids = list(self._streams)
        for rid in ids:
            self.abort(rid)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # ---- requests ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return self._stats

    async def generate(self, request_id: str, prompt_token_ids: list[int], params) -> AsyncIterator[RequestOutput]:
        """Submit and yield deltas until finished. Cancelling the consumer aborts the request."""
        if not self.accepting:
            raise EngineStopped("server is shutting down")
        if self.error is not None:
            raise EngineStopped(f"engine failed: {self.error}")
        loop = asyncio.get_running_loop()
        sub = _Submit(request_id, prompt_token_ids, params, asyncio.Queue(), loop)
        with self._lock:
            if len(self._streams) >= self.max_pending:
                raise EngineOverloaded(f"too many requests in flight ({self.max_pending})")
            if request_id in self._streams:
                raise ValueError(f"duplicate request id {request_id}")
            self._streams[request_id] = sub
        self._inbox.put(("add", sub))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await sub.out.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    # ---- worker thread -----------------------------------------------------------------
    def _deliver(self, rid: str, item) -> None:
        with self._lock:
            sub = self._streams.get(rid)
            done = isinstance(item, BaseException) or item.finished
            if sub is not None and done:
                del self._streams[rid]
        if sub is not None:
            sub.loop.call_soon_threadsafe(sub.out.put_nowait, item)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    self.core.add_request(arg.request_id, arg.prompt_token_ids, arg.params)
                except Exception as e:  # validation failure: report to that request only
                    self._deliver(arg.request_id, e)
            else:
                with self._lock:
                    known = arg in self._streams
                self.core.abort_request(arg)
                if known:
                    with self._lock:
                        self._streams.pop(arg, None)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            if not self.core.has_unfinished():
                self._stats = self.core.stats()
                self._wake.wait(timeout=0.1)
                self._wake.clear()
                continue
            self.step_started = time.monotonic()
            try:
                outputs = self.core.step()
            except Exception as e:  # a failing step fails its requests, never the process
                log.exception("engine step failed")
                self.error = e
                with self._lock:
                    ids = list(self._streams)
                for rid in ids:
                    self.core.abort_request(rid)
                    self._deliver(rid, RuntimeError(f"engine step failed: {e}"))
                continue
            finally:
                self.last_step_s = time.monotonic() - self.step_started
                self.step_started = None
            if self.last_step_s > self.step_watchdog_s:
                log.warning("engine step took %.1fs (watchdog %.1fs)", self.last_step_s, self.step_watchdog_s)
            for out in outputs:
                self._deliver(out.request_id, out)
            self._stats = self.core.stats()

    def step_overdue(self) -> bool:
        """Watchdog: True while the current step has run longer than the limit."""
        started = self.step_started
        return started is not None and time.monotonic() - started > self.step_watchdog_s
