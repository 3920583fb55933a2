"""A real redis-server on a free loopback port, for the benchmarks and the tests that need one: started,
SIGKILLed (a crash) and started again on the same port and folder, stopped. With `persistent`, an
append-only file fsynced on every write, so a restarted server has every key the killed one acknowledged."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agents_eval.harness.servers.process import free_port

START_TIMEOUT_S = 10.0


@dataclass
class RedisServer:
    port: int
    workdir: Path
    persistent: bool = False
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        durability = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *durability,
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.1):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not listen on port {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextlib.contextmanager
def running_redis(workdir: Path, persistent: bool = False) -> Iterator[RedisServer]:
    workdir.mkdir(parents=True, exist_ok=True)
    server = RedisServer(free_port(), workdir, persistent)
    server.start()
    try:
        yield server
    finally:
        server.stop()
