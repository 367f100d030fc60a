"""`dsv4 serve`: build the engine, run uvicorn, drain gracefully on SIGTERM.

SIGTERM/SIGINT: stop admitting (new POSTs get 503 while the socket stays open), let in-flight
requests finish for up to `shutdown_timeout` seconds, then abort what is left and exit 0.
A second signal exits at once.
"""
from __future__ import annotations

import logging
import threading
import time

import uvicorn

from ..engine.async_engine import AsyncEngine
from .app import ServerConfig, create_app
from .chat_bridge import ChatBridge

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, shutdown_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self._draining = False

    def handle_exit(self, sig, frame) -> None:  # called from the signal handler
        if self._draining:
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        self.engine.accepting = False
        log.info("signal %s: draining in-flight requests (up to %.0fs)", sig, self.shutdown_timeout)
        threading.Thread(target=self._drain, name="dsv4-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        while self.engine.num_pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.engine.num_pending():
            log.warning("shutdown timeout: aborting %d requests", self.engine.num_pending())
        self.engine.shutdown()
        self.should_exit = True


def serve(core, bridge: ChatBridge, *, model_name: str, host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, shutdown_timeout: float = 30.0, max_pending: int = 256,
          step_watchdog_s: float = 120.0, log_level: str = "info") -> int:
    engine = AsyncEngine(core, max_pending=max_pending, step_watchdog_s=step_watchdog_s)
    cfg = ServerConfig(model_name=model_name, max_model_len=core.max_model_len, api_key=api_key)
    app = create_app(engine, bridge, cfg)
    engine.start()
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                            access_log=False)
    server = DrainingServer(config, engine, shutdown_timeout)
    try:
        server.run()
    finally:
        engine.shutdown()
    return 0
