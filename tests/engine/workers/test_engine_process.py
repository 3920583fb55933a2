"""The colocated engine as its own process (what the gateway serves by default): the same tokens, text and
logprobs as the engine in this process, the async front unchanged, KV blocks freed on abort, session pins
reused, and a killed engine process started again with its requests re-run from where they were."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from engine.config import EngineSettings
from engine.core.async_engine import AsyncLLMEngine, EngineDeadError
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef
from engine.workers.coordinator.worker_engine import WorkerEngine, colocated_engine
from engine.workers.deployment import DeploymentSettings
from tests.conftest import cpu_ticks, settle, wait_for_async

pytestmark = pytest.mark.slow

SETTINGS = EngineSettings(num_kv_blocks=256, block_size=8, max_num_batched_tokens=64)
PROMPTS = [[1, *range(30, 30 + n)] for n in (5, 18, 41, 9)]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
SAMPLED = SamplingParams(temperature=0.9, seed=5, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def process() -> Iterator[WorkerEngine]:
    engine = colocated_engine("tiny", SETTINGS)
    yield engine
    engine.shutdown()


def in_process(prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]:
    return LLMEngine("tiny", SETTINGS).generate(prompts, params)


def kill(engine: WorkerEngine) -> int:
    pid = engine.workers[0].process.pid
    assert pid is not None and pid > 0 and pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    return pid


def test_one_worker_no_controller(process: WorkerEngine) -> None:
    assert len(process.workers) == 1 and process.capacity is None
    assert process.workers[0].process.pid != os.getpid()


def test_the_engine_process_yields_the_cores_to_the_gateway(process: WorkerEngine) -> None:
    """Its niceness is the gateway's plus `worker_nice`: on shared cores the gateway's requests go first."""
    pid = process.workers[0].process.pid
    added = DeploymentSettings.colocated().worker_nice
    assert added > 0
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + added)


def test_an_idle_engine_process_sleeps_on_its_pipe(process: WorkerEngine) -> None:
    """With no KV receivers every input is a command on its pipe, so an idle turn waits 50 ms for one instead of
    polling every 2 ms (about 35 ms of CPU a second on this host). It still answers at once."""
    pid = process.workers[0].process.pid
    settle([pid])
    before = cpu_ticks(pid)
    time.sleep(2.0)
    assert cpu_ticks(pid) - before <= 3, "more than 30 ms of CPU in 2 s idle"
    assert [c.token_ids for c in process.generate(PROMPTS[:1], GREEDY)] == \
        [c.token_ids for c in in_process(PROMPTS[:1], GREEDY)]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy-logprobs", "sampled"])
def test_same_tokens_text_and_logprobs_as_in_process(process: WorkerEngine, params: SamplingParams) -> None:
    results, expected = process.generate(PROMPTS, params), in_process(PROMPTS, params)
    assert [(r.token_ids, r.text, r.finish_reason) for r in results] == \
        [(e.token_ids, e.text, e.finish_reason) for e in expected]
    for result, reference in zip(results, expected, strict=True):  # float sums may split over threads otherwise
        assert [lp.logprob for lp in result.logprobs] == pytest.approx([lp.logprob for lp in reference.logprobs],
                                                                       abs=1e-5)


def test_stop_strings_end_the_same_way(process: WorkerEngine) -> None:
    prompt = ["the agent reads the log"]
    [full] = in_process(prompt, SamplingParams(temperature=0, max_tokens=12))
    params = SamplingParams(temperature=0, max_tokens=12, stop=[full.text[4:7]])
    [result], [expected] = process.generate(prompt, params), in_process(prompt, params)
    assert (result.text, result.finish_reason) == (expected.text, expected.finish_reason) == (expected.text, "stop")


def test_a_session_turn_reuses_the_pinned_kv(process: WorkerEngine) -> None:
    session = SessionRef("process-agent", ttl_s=60.0)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = [1, *range(100, 140)]
    process.add_request(prompt, params, "turn-1", session=session)
    first = Completion("turn-1")
    while process.tracked:
        for out in process.step():
            first.add(out)
    follow_up = [*prompt, *first.token_ids, 7, 8]
    process.add_request(follow_up, params, "turn-2", session=session)
    cached = 0
    while process.tracked:
        cached = max([cached] + [out.num_cached_tokens for out in process.step()])
    assert cached == len(prompt) + len(first.token_ids) - 1


async def test_async_front_streams_and_an_abort_frees_the_blocks() -> None:
    engine = AsyncLLMEngine(colocated_engine("tiny", SETTINGS))
    engine.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
        streams = [[t async for out in engine.generate(p, params) for t in out.new_token_ids] for p in PROMPTS[:2]]
        assert streams == [c.token_ids for c in in_process(PROMPTS[:2], params)]
        free = engine.engine.stats().kv_blocks_free
        stream = engine.generate("a long answer", SamplingParams(max_tokens=500, ignore_eos=True))
        assert not (await anext(stream)).finished
        await stream.aclose()  # type: ignore[attr-defined]
        assert await wait_for_async(
            lambda: not engine.engine.has_unfinished() and engine.engine.stats().kv_blocks_free == free)
        assert engine.engine.stats().running == 0
    finally:
        engine.shutdown()


def test_a_killed_engine_process_is_started_again_and_its_requests_rerun() -> None:
    engine = colocated_engine("tiny", SETTINGS)
    try:
        ids = [engine.add_request(p, SAMPLED) for p in PROMPTS]
        results = {i: Completion(i) for i in ids}
        killed = None
        while engine.tracked:
            for out in engine.step():
                results[out.request_id].add(out)
                if killed is None and len(results[out.request_id].token_ids) >= 3:
                    killed = kill(engine)
        assert [results[i].token_ids for i in ids] == [c.token_ids for c in in_process(PROMPTS, SAMPLED)]
        assert killed is not None and engine.dead_workers == [0] and engine.workers[0].pid != killed
        assert engine.workers[0].alive and engine.pool.restarts[0] == 1
    finally:
        engine.shutdown()


async def test_with_no_restart_left_the_requests_fail_not_hang() -> None:
    deployment = DeploymentSettings.colocated().model_copy(update={"max_restarts": 0})
    engine = AsyncLLMEngine(WorkerEngine("tiny", SETTINGS, deployment))
    engine.start()
    try:
        stream = engine.generate("a long answer", SamplingParams(max_tokens=2000, ignore_eos=True))
        await anext(stream)
        kill(engine.engine)  # type: ignore[arg-type]
        with pytest.raises(EngineDeadError, match="every engine worker has died"):
            async for _ in stream:
                pass
    finally:
        engine.shutdown()


async def test_an_idle_engine_process_releases_expired_pins_and_says_so() -> None:
    engine = AsyncLLMEngine(colocated_engine("tiny", SETTINGS))
    engine.start()

    async def free_blocks_once(done: Callable[[int], bool]) -> int:
        await wait_for_async(lambda: done(engine.engine.stats().kv_blocks_free))
        return engine.engine.stats().kv_blocks_free

    try:
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        [_ async for _ in engine.generate(PROMPTS[2], params, session=SessionRef("short-gap", ttl_s=3.0))]
        pinned = await free_blocks_once(lambda free: free > 0)  # its first Load is in
        assert 0 < pinned < SETTINGS.num_kv_blocks  # type: ignore[operator]
        # no request comes: the worker expires the pin on its own and reports it
        assert await free_blocks_once(lambda free: free == SETTINGS.num_kv_blocks) == SETTINGS.num_kv_blocks
    finally:
        engine.shutdown()
