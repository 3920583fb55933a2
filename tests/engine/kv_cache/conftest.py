"""A redis-server of a test's own (the session-wide one must outlive tests that kill theirs), and the store
connections of the engines a test made closed with it (an open Redis socket would warn in a later test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agents_eval.bench.redis_server import RedisServer, running_redis
from engine.core.llm_engine import LLMEngine
from tests.conftest import close_after_test

OwnRedis = RedisServer


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:
        yield server


def opened(engine: LLMEngine) -> LLMEngine:
    """Track `engine`: its stores' connections close when the test ends (without the flush of a shutdown)."""
    if engine.tiers is not None:
        close_after_test(engine.tiers.close)
    return engine
