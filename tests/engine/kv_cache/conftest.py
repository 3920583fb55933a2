"""A redis-server of a test's own (the session-wide one must outlive tests that kill theirs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agents_eval.bench.redis_server import RedisServer, running_redis

OwnRedis = RedisServer


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:
        yield server
