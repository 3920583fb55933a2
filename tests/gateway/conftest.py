"""Real gateways for the tests: uvicorn on a free loopback port, in a thread of this process (fast, shares
the tiny model) or as a separate `agentserve serve` process (for multi-process and signal tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from engine.config import EngineSettings
from engine.core.async_engine import ServingEngine
from engine.workers.coordinator.worker_engine import colocated_engine
from gateway.auth import hash_key
from gateway.server.app import create_app
from gateway.server.http import uvicorn_config
from gateway.settings import GatewaySettings
from tests.conftest import free_port

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch its price list
ADMIN_KEY = "sk-as-test-admin"
ADMIN = {"name": "operator", "sha256": hash_key(ADMIN_KEY), "admin": True}  # an api_keys entry
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def wait_until_ready(url: str, timeout_s: float = 180.0) -> None:  # workers load the model on a busy CPU
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"gateway at {url} did not become ready")


@contextlib.contextmanager
def running_gateway(settings: GatewaySettings, engine: ServingEngine | None = None) -> Iterator[str]:
    """uvicorn serving the app in a background thread; yields its base URL."""
    with serving(create_app(settings, engine), settings.port) as url:
        yield url


@contextlib.contextmanager
def serving(app: FastAPI, port: int) -> Iterator[str]:
    """uvicorn serving an app built by the test (to reach `app.state.gateway`); yields its base URL."""
    config = uvicorn_config(app, GatewaySettings(), host="127.0.0.1", port=port, log_level="warning", loop="asyncio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    """The gateway as it serves by default: its engine in a worker process of its own."""
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=16, api_keys=[ADMIN])
    with running_gateway(settings, colocated_engine("tiny", EngineSettings(num_kv_blocks=1024))) as url:
        yield url


GatewayProcess = Callable[..., tuple[subprocess.Popen[bytes], str]]


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Start `agentserve serve --model tiny` processes with extra environment; all stopped after the module
    (a process takes seconds to start: a module's tests may share them)."""
    started: list[subprocess.Popen[bytes]] = []
    logs: list[BinaryIO] = []
    tmp_path = tmp_path_factory.mktemp("gateways")

    def start(**env: str) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        log = open(tmp_path / f"gateway-{port}.log", "wb")  # noqa: SIM115 - closed after the processes stop
        logs.append(log)
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("agentserve")), "serve", "--model", "tiny", "--port", str(port)],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url)
        return process, url

    yield start
    running = [process for process in started if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGINT)
    for process in running:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
    for log in logs:
        log.close()
