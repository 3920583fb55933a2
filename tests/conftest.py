"""Fixtures that write small random-weight Hugging Face checkpoints and load `transformers` references."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
import transformers

from agents_eval.harness.servers.process import free_port as free_port  # the tests import it from here
from agents_eval.harness.servers.redis import running_redis

# Engines size their KV cache from the RAM available at start and allocate it eagerly; the tests start many
# engines at once (processes of their own included, which inherit this), so they keep a fixed, small pool.
os.environ.setdefault("AGENTSERVE_ENGINE_KV_CACHE_BYTES", str(512 * 1024 * 1024))

HF_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
}
SHAPES = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2)

MakeCheckpoint = Callable[..., Path]


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random and far from init defaults, so a misplaced norm or bias shows in the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise)


def write_hf_checkpoint(directory: Path, arch: str, tie: bool, rope_scaling: dict[str, Any] | None,
                        max_shard_size: str | None, seed: int) -> Path:
    config_cls, model_cls = HF_CLASSES[arch]
    config = config_cls(**SHAPES, tie_word_embeddings=tie, rope_scaling=rope_scaling)
    torch.manual_seed(seed)
    model = model_cls(config).float()
    randomize(model, seed)
    shards = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, safe_serialization=True, **shards)
    return directory


@pytest.fixture(scope="session")
def make_hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> MakeCheckpoint:
    """`make_hf_checkpoint(arch="llama", tie=False, rope_scaling=None, max_shard_size=None, seed=0) -> Path`.

    arch: "llama" or "qwen2"; rope_scaling: a Hugging Face rope dict (`{"rope_type": "llama3", ...}`);
    max_shard_size:
    e.g. "100KB" for a sharded checkpoint with `model.safetensors.index.json`. Cached per session by
    arguments: treat the directory as read-only (copy it to alter it).
    """
    made: dict[str, Path] = {}

    def make(arch: str = "llama", tie: bool = False, rope_scaling: dict[str, Any] | None = None,
             max_shard_size: str | None = None, seed: int = 0) -> Path:
        key = json.dumps([arch, tie, rope_scaling, max_shard_size, seed], sort_keys=True)
        if key not in made:
            directory = tmp_path_factory.mktemp(f"hf-{arch}")
            made[key] = write_hf_checkpoint(directory, arch, tie, rope_scaling, max_shard_size, seed)
        return made[key]

    return make


@pytest.fixture(scope="session")
def load_hf_reference() -> Callable[[Path], torch.nn.Module]:
    """`load_hf_reference(checkpoint)`: the `transformers` model, float32, eval mode, eager attention."""
    loaded: dict[Path, torch.nn.Module] = {}

    def load(directory: Path) -> torch.nn.Module:
        if directory not in loaded:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                directory, dtype=torch.float32, attn_implementation="eager")
            loaded[directory] = model.eval()
        return loaded[directory]

    return load


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Poll until condition holds (True) or timeout_s passes (False): a bounded wait for tests."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def wait_for_async(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """`wait_for` for a test running on an event loop: polls without blocking the loop."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def cpu_ticks(pid: int) -> int:
    """User and system time of a process, in clock ticks (proc(5): fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def settle(pids: list[int], timeout_s: float = 30.0) -> None:
    """Wait (bounded) until each process used at most a tick of CPU in half a second: work a slow host is still
    finishing must not count as idle polling. A process that polls fast enough to fail an idle check never
    settles, and the check that follows fails as it should."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = [cpu_ticks(pid) for pid in pids]
        time.sleep(0.5)
        if all(cpu_ticks(pid) - ticks <= 1 for pid, ticks in zip(pids, before, strict=True)):
            return


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free loopback port, stopped after the session."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


CLOSE_AFTER_TEST: list[Callable[[], object]] = []


def close_after_test(close: Callable[[], object]) -> None:
    """Call `close` when the running test ends: a socket left open until the collector finds it raises a
    ResourceWarning in whichever test runs then, and warnings are errors."""
    CLOSE_AFTER_TEST.append(close)


@pytest.fixture(autouse=True)
def close_what_the_test_opened() -> Iterator[None]:
    yield
    while CLOSE_AFTER_TEST:
        CLOSE_AFTER_TEST.pop()()


def openai_client(url: str, key: str = "unused") -> openai.OpenAI:
    """An openai client of the gateway at `url` (no retries), closed when the test ends (its keep-alive socket).
    A module-scoped fixture opens its own with `with openai.OpenAI(...)`."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    close_after_test(client.close)
    return client
