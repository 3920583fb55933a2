"""The main job as a new user runs it (`bash scripts/run.sh`, default config: SmolLM2-135M-Instruct) answers an
English question through the openai SDK, in a multi-turn session that reuses its KV."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.config import REPO_ROOT
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import wait_until_ready

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class MainJob:
    url: str
    log_path: Path


@pytest.fixture(scope="module")
def main_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MainJob]:
    port = free_port()
    log_path = Path(tmp_path_factory.mktemp("main-job")) / "run.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(["bash", str(REPO_ROOT / "scripts" / "run.sh"), "serve", "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
                                   start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(url, timeout_s=180)
            yield MainJob(url, log_path)
        finally:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def test_answers_in_english(main_job: MainJob) -> None:
    client = openai_client(main_job.url)
    [model] = [m.id for m in client.models.list().data]
    assert model == "smollm2"
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model=model, messages=question, max_tokens=24, temperature=0,
                                           extra_headers={"X-Session-Id": "tourist"})
    answer = reply.choices[0].message.content or ""
    assert "Paris" in answer

    follow_up = [*question, {"role": "assistant", "content": answer},
                 {"role": "user", "content": "And the capital of Italy?"}]
    second = client.chat.completions.create(model=model, messages=follow_up, max_tokens=24, temperature=0,
                                            extra_headers={"X-Session-Id": "tourist"})
    assert "Rome" in (second.choices[0].message.content or "")
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) >= reply.usage.prompt_tokens  # type: ignore[union-attr]


def test_the_startup_heap_is_frozen_before_serving(main_job: MainJob) -> None:
    log = main_job.log_path.read_text()
    frozen = int(log.split("startup heap frozen: ")[1].split()[0])
    assert frozen > 10_000  # the modules, the model and the tokenizer
    assert log.index("startup heap frozen") < log.index("Uvicorn running")
