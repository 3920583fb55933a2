"""A redis-server of a test's own (the session-wide one must outlive tests that kill theirs)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port


@dataclass
class OwnRedis:
    url: str
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"redis-server did not listen on port {port}")
        yield OwnRedis(f"redis://127.0.0.1:{port}/0", process)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)
