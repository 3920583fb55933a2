"""The gateway under test for `agentserve bench gateway`: uvicorn in a thread of the benchmark process (as
`agentserve serve` runs it, `gateway.server.http`; no access log), behind an ASGI wrapper that times each
request inside the server, from the app being called to its last body byte handed to uvicorn (and, while
`ServerProbe.time_steps` is on, step by step), and that hands out the server's event loop, so the
engine-only path can run on the very loop the gateway uses."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.core.async_engine import AsyncLLMEngine, ServingEngine
from engine.core.llm_engine import LLMEngine
from engine.gc_heap import heap_frozen
from engine.workers.coordinator.worker_engine import WorkerEngine
from gateway.server.app import create_app
from gateway.server.http import uvicorn_config
from gateway.server.state import GatewayState
from gateway.settings import GatewaySettings
from trajectory import step_timer

BENCH_ID_HEADER = b"x-bench-id"
OUTSIDE_STEPS, PARSE_STEP, SEND_STEP = "other", "parse", "send"
READY_TIMEOUT_S = 60.0
T = TypeVar("T")


@dataclass
class ServerProbe:
    """Seconds each request tagged with `x-bench-id` spent in the app (uvicorn's parsing and socket excluded),
    its nanoseconds per step (`trajectory.step_timer`), and the server's event loop."""

    seconds: dict[str, float] = field(default_factory=dict)
    steps: dict[str, dict[str, int]] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    time_steps: bool = False  # step timers on: their probes cost time, so the latency waves run without them


class TimedApp:
    def __init__(self, app: ASGIApp, probe: ServerProbe) -> None:
        self.app, self.probe = app, probe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.probe.loop = self.probe.loop or asyncio.get_running_loop()
        bench_id = _bench_id(scope) if scope["type"] == "http" else None
        if bench_id is None:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        steps = step_timer.timing(OUTSIDE_STEPS) if self.probe.time_steps else None
        if steps is not None:
            steps.enter(PARSE_STEP)  # until the route's handler starts

        async def timed_send(message: Message) -> None:
            if steps is not None:
                steps.enter(SEND_STEP)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.probe.seconds[bench_id] = time.perf_counter() - start
                if steps is not None:
                    steps.leave(SEND_STEP)
                    self.probe.steps[bench_id] = steps.finish()
            elif steps is not None:
                steps.leave(SEND_STEP)

        await self.app(scope, receive, timed_send)


def _bench_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == BENCH_ID_HEADER:
            return str(value.decode())
    return None


@dataclass
class RunningGateway:
    url: str
    state: GatewayState
    probe: ServerProbe

    @property
    def engine(self) -> AsyncLLMEngine:
        return self.state.engine

    def run_on_server_loop(self, coro: Coroutine[Any, Any, T], timeout_s: float = 300.0) -> T:
        """Run a coroutine on the gateway's event loop (uvicorn's thread) and wait for its result."""
        if self.probe.loop is None:
            raise RuntimeError("the gateway's event loop is not known yet")
        return asyncio.run_coroutine_threadsafe(coro, self.probe.loop).result(timeout_s)


def _loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def running_gateway(settings: GatewaySettings, engine: ServingEngine) -> Iterator[RunningGateway]:
    """The gateway on a free loopback port, served from a background thread until the block exits."""
    sock = _loopback_socket()
    port = int(sock.getsockname()[1])
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": port})
    app = create_app(settings, engine)
    probe = ServerProbe()
    config = uvicorn_config(TimedApp(app, probe), settings, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="bench-gateway", daemon=True)
    with heap_frozen():  # as `agentserve serve` freezes it; unfrozen after, since this process may go on (the tests)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_ready(url, thread)
            yield RunningGateway(url, app.state.gateway, probe)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()


def _wait_until_ready(url: str, thread: threading.Thread) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and thread.is_alive():
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the gateway at {url} did not become ready")


def reset_prefix_cache(engine: AsyncLLMEngine, timeout_s: float = 30.0) -> None:
    """Forget every cached block, on the engine thread between two steps; the engine must be idle."""
    done: concurrent.futures.Future[bool] = concurrent.futures.Future()

    def reset(llm: ServingEngine) -> None:
        try:
            if not isinstance(llm, LLMEngine | WorkerEngine):
                raise TypeError("the gateway benchmark serves an engine of its own, not upstreams")
            done.set_result(llm.reset_prefix_cache())
        except Exception as error:  # handed to the waiting caller; the engine loop must go on
            done.set_exception(error)

    engine.call(reset)
    if not done.result(timeout_s):
        raise RuntimeError("prefix cache reset refused: a request still holds KV blocks")
