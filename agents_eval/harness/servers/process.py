"""A server as a child process: a free loopback port, its own process group, its output in a log file,
ready once `GET <ready_path>` answers 200, stopped with SIGTERM (killed after a deadline). Every launcher
in `agents_eval.harness.servers` (the gateway, Redis, a peer server) starts its process through here."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

READY_TIMEOUT_S = 300.0  # disaggregated workers load the model in their own processes
STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # what this benchmark set, for the report

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def running_process(command: list[str], port: int, env: dict[str, str], log_path: Path, ready_path: str,
                    name: str, timeout_s: float = READY_TIMEOUT_S,
                    hidden_env: Mapping[str, str] | None = None) -> Iterator[ServerProcess]:
    """A server process, ready once `GET ready_path` answers 200, until the block exits. `hidden_env` is set
    for the process but not kept in `ServerProcess.env` (which reports print)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:  # its own process group: its worker processes stop with it
        process = subprocess.Popen(command, env={**os.environ, **env, **(hidden_env or {})}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path, env)
    try:
        _wait_until_ready(server, ready_path, name, timeout_s)
        yield server
    finally:
        stop(server)


def _wait_until_ready(server: ServerProcess, ready_path: str, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:  # one client: each of httpx.get's builds an SSL context (~10 ms)
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"{name} exited with status {server.process.returncode} before it was "
                                   f"ready; its log ({server.log_path}) ends:\n{server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}{ready_path}").status_code == 200:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{name} at {server.url} was not ready within {timeout_s:.0f} s; its log "
                       f"({server.log_path}) ends:\n{server.log_tail()}")


def stop(server: ServerProcess) -> None:
    """SIGTERM and wait for the drain; the process group is killed if it outlives `STOP_TIMEOUT_S`."""
    process = server.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
