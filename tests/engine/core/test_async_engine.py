from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from engine.config import EngineSettings
from engine.core.async_engine import AsyncLLMEngine, EngineDeadError
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import RequestError, SamplingParams
from engine.core.sequence import SessionRef
from tests.conftest import wait_for_async


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncLLMEngine]:
    async_engine = AsyncLLMEngine(LLMEngine("tiny", EngineSettings(num_kv_blocks=256)))
    async_engine.start()
    yield async_engine
    async_engine.shutdown()


async def collect(engine: AsyncLLMEngine, prompt: str, params: SamplingParams) -> tuple[list[int], str]:
    tokens: list[int] = []
    text = ""
    async for out in engine.generate(prompt, params):
        tokens += out.new_token_ids
        text += out.new_text
    return tokens, text


async def test_concurrent_streams_match_the_sync_engine(engine: AsyncLLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = ["first agent", "second agent says more", "third"]
    results = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
    reference = LLMEngine("tiny", EngineSettings(num_kv_blocks=256)).generate(prompts, params)
    assert [r[0] for r in results] == [c.token_ids for c in reference]
    assert [r[1] for r in results] == [c.text for c in reference]


async def test_leaving_the_stream_aborts_and_frees_blocks(engine: AsyncLLMEngine) -> None:
    free_before = engine.engine.kv.num_free_blocks
    stream = engine.generate("a long answer", SamplingParams(max_tokens=500, ignore_eos=True))
    first = await anext(stream)
    assert not first.finished
    await stream.aclose()  # what a disconnected client's cancelled task does
    assert await wait_for_async(lambda: not engine.engine.has_unfinished())
    assert engine.engine.kv.num_free_blocks == free_before


async def test_cancelled_task_aborts(engine: AsyncLLMEngine) -> None:
    task = asyncio.create_task(collect(engine, "cancel me", SamplingParams(max_tokens=500, ignore_eos=True)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_for_async(lambda: not engine.engine.has_unfinished())


async def test_a_reply_not_streamed_comes_as_its_first_token_and_the_rest(engine: AsyncLLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    every = [out async for out in engine.generate("first and final", params)]
    ends = [out async for out in engine.generate("first and final", params, every_token=False)]
    assert len(every) == 12 and len(ends) == 2
    assert len(ends[0].new_token_ids) == 1 and not ends[0].finished and ends[1].finished
    for field in ("new_token_ids", "logprobs"):
        assert [x for out in ends for x in getattr(out, field)] == [x for out in every for x in getattr(out, field)]
    assert "".join(out.new_text for out in ends) == "".join(out.new_text for out in every)
    assert ends[1].finish_reason == every[-1].finish_reason == "length"


async def test_a_reply_not_streamed_left_early_frees_its_blocks(engine: AsyncLLMEngine) -> None:
    free_before = engine.engine.kv.num_free_blocks
    stream = engine.generate("left early", SamplingParams(max_tokens=500, ignore_eos=True), every_token=False)
    await anext(stream)  # the first token; the rest is being held
    await stream.aclose()
    assert await wait_for_async(lambda: not engine.engine.has_unfinished())
    assert engine.engine.kv.num_free_blocks == free_before
    assert not engine.engine.outputs._states  # nothing held for it


async def test_a_burst_of_commands_wakes_the_engine_thread_once_and_runs_them_all(
        engine: AsyncLLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands put while the thread has not drained the ones before them wake it no more: with the thread held
    inside a command, a burst of 50 wakes it exactly once, whatever the host's speed."""
    wakeups: list[int] = []
    monkeypatch.setattr(engine.engine, "wakeup", lambda: wakeups.append(1))
    inside, release = threading.Event(), threading.Event()
    engine.call(lambda e: (inside.set(), release.wait(30)))
    assert await asyncio.to_thread(inside.wait, 30)  # the thread drains its commands and runs this one
    wakeups.clear()
    answers = [asyncio.ensure_future(engine.query(lambda e, i=i: i)) for i in range(50)]
    await asyncio.sleep(0)  # every query has submitted its command
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*answers), 60) == list(range(50))
    assert len(wakeups) == 1


async def test_bad_request_raises_before_streaming(engine: AsyncLLMEngine) -> None:
    with pytest.raises(RequestError, match="prompt is empty"):
        await collect(engine, "", SamplingParams())


async def test_duplicate_request_id_fails_only_the_duplicate(engine: AsyncLLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first = engine.generate("same id", params, request_id="dup")
    await anext(first)
    with pytest.raises(RequestError, match="already running"):
        async for _ in engine.generate("same id", params, request_id="dup"):
            pass
    await first.aclose()


async def test_generate_after_shutdown_fails() -> None:
    stopped = AsyncLLMEngine(LLMEngine("tiny", EngineSettings(num_kv_blocks=16)))
    stopped.start()
    stopped.shutdown()
    with pytest.raises(EngineDeadError):
        await collect(stopped, "hello", SamplingParams())


async def test_session_turns_through_the_async_engine_reuse_the_pin(engine: AsyncLLMEngine) -> None:
    session = SessionRef("async-agent", ttl_s=60.0)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = [1, *range(100, 140)]
    outputs = [out async for out in engine.generate(prompt, params, session=session)]
    generated = [t for out in outputs for t in out.new_token_ids]
    follow_up = [out async for out in engine.generate([*prompt, *generated, 7, 8], params, session=session)]
    assert follow_up[-1].num_cached_tokens == len(prompt) + len(generated) - 1
