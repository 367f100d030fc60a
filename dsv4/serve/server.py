"""Run the HTTP app on uvicorn around an engine core; drain gracefully on SIGTERM / SIGINT.

On the first signal: stop admitting (new POSTs get 503; GETs and the socket stay up), let the
requests in flight finish for up to `shutdown_timeout` seconds, end what is left with
finish_reason "abort", then exit with status 0. A second signal exits at once.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn

from ..engine.async_engine import AsyncEngine
from .app import ServerConfig, create_app
from .chat_bridge import ChatBridge
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    model_name: str
    model_aliases: tuple[str, ...] = ()  # more ids clients may send (ServerConfig.model_aliases)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_running: int = 256          # should match the core's max_num_seqs
    max_queued: int = 256
    shutdown_timeout: float = 30.0
    step_watchdog_s: float = 120.0
    max_body_bytes: int = 4 * 1024 * 1024
    default_thinking: bool = False
    log_level: str = "warning"
    responses_store: int = 256      # /v1/responses kept for previous_response_id; 0: none
    allowed_origins: tuple[str, ...] = ()  # CORS origins ("*": any)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, shutdown_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self._draining = False

    def handle_exit(self, sig, frame) -> None:
        # Deliberately not uvicorn's handler: it closes the socket at once and re-raises the
        # signal after shutdown (exit status -15); we drain first and exit 0.
        if self._draining:
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        self.engine.accepting = False
        log.warning("signal %s: draining %d requests (up to %gs)", sig, self.engine.num_pending(),
                    self.shutdown_timeout)
        threading.Thread(target=self._drain, name="dsv4-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        while self.engine.num_pending() and time.monotonic() < deadline and not self.force_exit:
            time.sleep(0.05)
        if self.engine.num_pending():
            log.warning("shutdown timeout: aborting %d requests", self.engine.num_pending())
        self.engine.shutdown()
        self.should_exit = True


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio only turns Nagle off (TCP_NODELAY) on sockets that say they are TCP;
    # with Nagle, every response written in two parts waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    # listen now, not when uvicorn starts: the URL is printed before that, and a client that connects in between
    # to a bound but not yet listening port is refused (seen as a flaky test_server_fuzz setup, session 24); queued
    # connections wait for uvicorn's accept loop instead (asyncio's listen later only resets the backlog)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(core, opts: ServeOptions) -> int:
    """Serve `core` (an EngineCore with .tokenizer, .vocab_size, .max_model_len) until a signal."""
    if not _is_loopback(opts.host) and not opts.api_key:
        log.warning("serving on %s without an API key: anyone who can reach it can use it", opts.host)
    engine = AsyncEngine(core, max_running=opts.max_running, max_queued=opts.max_queued,
                         step_watchdog_s=opts.step_watchdog_s)
    bridge = ChatBridge(getattr(core, "tokenizer", None), core.vocab_size, default_thinking=opts.default_thinking)
    cfg = ServerConfig(model_name=opts.model_name, model_aliases=opts.model_aliases, max_model_len=core.max_model_len,
                       api_key=opts.api_key, max_body_bytes=opts.max_body_bytes, responses_store=opts.responses_store,
                       allowed_origins=opts.allowed_origins)
    app = create_app(engine, bridge, cfg, ServerMetrics())
    sock = bind_socket(opts.host, opts.port)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level=opts.log_level, timeout_graceful_shutdown=5, access_log=False,
                            lifespan="off")
    server = DrainingServer(config, engine, opts.shutdown_timeout)
    engine.start()
    url_host = f"[{host}]" if ":" in host else host
    how = f" ({core.describe()})" if hasattr(core, "describe") else ""  # (the resolved defaults: graphs, cache)
    print(f"dsv4 serve: model {opts.model_name!r} on http://{url_host}:{port}/v1{how}", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        engine.shutdown()
        sock.close()
    return 0


def exit_process(status: int) -> None:
    """End a finished server process now. Interpreter teardown after importing torch takes seconds
    (measured 2.4 s on a busy 2-core machine), which would count against --shutdown-timeout; the
    server has already drained and closed everything, so only the log buffers need flushing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
