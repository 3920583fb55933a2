"""`agentserve serve`: uvicorn (`gateway.server.http`) around the app, with a graceful drain on SIGTERM:
`/ready` turns 503 and new API requests are refused, running ones finish within `drain_timeout_s`,
then the process exits."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import torch
import uvicorn

from engine import freeze_startup_heap
from gateway.server.app import create_app
from gateway.server.http import uvicorn_config
from gateway.server.state import GatewayState
from gateway.settings import GatewaySettings

log = logging.getLogger("agentserve.gateway")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: GatewayState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.state.draining:
            super().handle_exit(sig, frame)
            return
        self.state.draining = True
        log.info("SIGTERM: draining %d in-flight requests", self.state.in_flight)
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.state.settings.drain_timeout_s
        while self.state.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.state.in_flight:
            log.warning("drain deadline passed with %d requests still running", self.state.in_flight)
        self.should_exit = True


def serve(settings: GatewaySettings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not settings.engine_in_process:
        # This process's torch work is then the load forecast (the engine is in its workers): a fraction of a
        # millisecond on one thread. On a thread per core its parallel regions wait for, and spin against, the
        # cores the workers hold: 4-6x slower on a busy 2-core host, and 18% of the gateway's py-spy samples.
        torch.set_num_threads(1)
    app = create_app(settings)
    config = uvicorn_config(app, settings, log_level="info", timeout_graceful_shutdown=1)
    log.info("startup heap frozen: %d objects the collector no longer walks", freeze_startup_heap())
    DrainingServer(config, app.state.gateway).run()
