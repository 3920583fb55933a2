"""Prefill and decode workers in separate processes: identical tokens to the colocated engine on every
transport that crosses processes, recompute on every kind of failed transfer, live role switches and
killed workers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import RequestError, SamplingParams
from engine.model.mask import QuerySelection, ScoredPolicy
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings
from tests.conftest import cpu_ticks, settle

pytestmark = pytest.mark.slow

SETTINGS = EngineSettings(num_kv_blocks=256, block_size=8, max_num_batched_tokens=64)
PROMPTS = [[1, *range(20, 20 + n)] for n in (4, 17, 33, 60, 9, 25)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, seed=11, max_tokens=10, ignore_eos=True)


def colocated(params: SamplingParams) -> list[list[int]]:
    return [r.token_ids for r in LLMEngine("tiny", SETTINGS).generate(PROMPTS, params)]


ALWAYS_REMOTE = CapacitySettings(enabled=False, local_prefill_max_tokens=0, local_prefill_max_uncached_share=0)


def start(transport: str = "shm", **deployment: object) -> WorkerEngine:
    """Every request crosses from the prefill to the decode worker; roles move only when a test says so."""
    return WorkerEngine("tiny", SETTINGS, DeploymentSettings(transport=transport, kv_timeout_s=2.0,
                                                                     **deployment), ALWAYS_REMOTE)


@pytest.fixture(scope="module", params=["shm", "tcp"])
def disaggregated(request: pytest.FixtureRequest) -> Iterator[WorkerEngine]:
    engine = start(request.param)
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_same_tokens_as_colocated(disaggregated: WorkerEngine, params: SamplingParams) -> None:
    before = sum(c.received for c in disaggregated.kv_counters().values())
    results = disaggregated.generate(PROMPTS, params)
    assert [r.token_ids for r in results] == colocated(params)
    counters = disaggregated.kv_counters().values()
    assert sum(c.received for c in counters) == before + len(PROMPTS)  # the KV came over, none recomputed
    assert sum(c.recomputed + c.timed_out for c in counters) == 0
    assert all(r.finish_reason == "length" for r in results)
    assert disaggregated.transfers.requests >= len(PROMPTS) and disaggregated.transfers.bytes > 0


def test_each_worker_froze_its_startup_heap_before_it_served(disaggregated: WorkerEngine) -> None:
    """The model's and torch's objects, hundreds of thousands, out of the collector's reach (engine.gc_heap)."""
    assert all(worker.frozen_objects > 100_000 for worker in disaggregated.workers)


def test_idle_workers_sleep_on_their_pipes(disaggregated: WorkerEngine) -> None:
    """KV frames wake no pipe, so a worker polls its receivers only while a transfer to it was announced
    (`ExpectKV`) or its own sent blocks may still be read; idle after a transfer, each waits on its pipe (it polled
    every 2 ms before: about 45 ms of CPU a second on this host), and the next transfer is as whole."""
    assert [r.token_ids for r in disaggregated.generate(PROMPTS[:1], GREEDY)] == colocated(GREEDY)[:1]
    used = _idle_ticks(disaggregated)  # once the receiver has read the sent blocks and every worker reported idle
    assert max(used) <= 3, f"clock ticks of CPU in 2 s idle, per worker: {used}"
    received = sum(c.received for c in disaggregated.kv_counters().values())
    assert [r.token_ids for r in disaggregated.generate(PROMPTS[1:3], GREEDY)] == colocated(GREEDY)[1:3]
    assert sum(c.received for c in disaggregated.kv_counters().values()) == received + 2


def test_an_abort_during_the_prefill_ends_the_decode_workers_wait_for_the_kv(
        disaggregated: WorkerEngine) -> None:
    """The decode worker was told the KV is coming (`ExpectKV`); an abort before the hand-off tells it too, so it
    goes back to waiting on its pipe instead of polling its receivers until the announcement lapses (60 s)."""
    request_id = disaggregated.add_request([1, *range(40, 540)], GREEDY)
    disaggregated.abort(request_id)
    while disaggregated.has_unfinished():
        disaggregated.step()
    assert max(_idle_ticks(disaggregated)) <= 3
    assert [r.token_ids for r in disaggregated.generate(PROMPTS[:1], GREEDY)] == colocated(GREEDY)[:1]


def _idle_ticks(engine: WorkerEngine, seconds: float = 2.0) -> list[int]:
    """Clock ticks of CPU each worker process used over `seconds`, once they settled."""
    pids = [w.process.pid for w in engine.workers]
    settle(pids)
    before = [cpu_ticks(pid) for pid in pids]
    time.sleep(seconds)
    return [cpu_ticks(pid) - ticks for pid, ticks in zip(pids, before, strict=True)]


def test_text_streams_whole_across_the_handoff(disaggregated: WorkerEngine) -> None:
    [expected] = LLMEngine("tiny", SETTINGS).generate(["the agent reads the log"], GREEDY)
    [result] = disaggregated.generate(["the agent reads the log"], GREEDY)
    assert result.text == expected.text and result.token_ids == expected.token_ids


def test_a_reply_not_streamed_is_its_first_token_and_the_rest_across_the_handoff(
        disaggregated: WorkerEngine) -> None:
    [expected] = LLMEngine("tiny", SETTINGS).generate(["the agent reads the log"], GREEDY)
    request_id = disaggregated.add_request("the agent reads the log", replace(GREEDY, every_token=False))
    outputs = []
    while disaggregated.has_unfinished():
        outputs += [out for out in disaggregated.step() if out.request_id == request_id]
    assert [len(out.new_token_ids) for out in outputs] == [1, len(expected.token_ids) - 1]  # not one per token
    assert [t for out in outputs for t in out.new_token_ids] == expected.token_ids
    assert "".join(out.new_text for out in outputs) == expected.text and outputs[-1].finished


def test_unknown_slo_class_is_refused_before_any_worker_sees_it(disaggregated: WorkerEngine) -> None:
    with pytest.raises(RequestError, match="slo_class 'gold' is not one of"):
        disaggregated.add_request([1, 2, 3], SamplingParams(max_tokens=2, slo_class="gold"))
    assert not disaggregated.tracked


def test_failed_transfers_are_recomputed() -> None:
    """Corrupt payload, wrong version, a transfer cut halfway, a decode worker that never receives."""
    engine = start("tcp")
    expected = colocated(GREEDY)[:2]
    try:
        for fault, counter in (("corrupt_payload", "rejected"), ("wrong_version", "rejected"),
                               ("cut", "timed_out"), ("drop", "timed_out")):
            before = engine.kv_counters()[1]
            engine.inject_kv_fault(fault)
            assert [r.token_ids for r in engine.generate(PROMPTS[:2], GREEDY)] == expected, fault
            after = engine.kv_counters()[1]
            assert getattr(after, counter) > getattr(before, counter), fault
            assert after.recomputed == before.recomputed + 2 and after.received == before.received, fault
        engine.inject_kv_fault(None)
        assert [r.token_ids for r in engine.generate(PROMPTS[:2], GREEDY)] == expected
        assert engine.kv_counters()[1].received == 2
    finally:
        engine.shutdown()


def test_role_switch_mid_stream_loses_and_duplicates_nothing() -> None:
    engine = start("shm")
    try:
        ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
        results = {i: Completion(i) for i in ids}
        for step in range(10_000):
            if not engine.has_unfinished():
                break
            if step == 3:
                engine.set_role(0, "decode")
                engine.set_role(1, "prefill")
            for out in engine.step():
                results[out.request_id].add(out)
        assert [results[i].token_ids for i in ids] == colocated(GREEDY)
        assert len(engine.role_switches) == 2
    finally:
        engine.shutdown()


def kill_worker(engine: WorkerEngine, worker_id: int) -> None:
    """SIGKILL one worker process by its own pid, never a process group (`os.kill(0, ...)` would be ours)."""
    pid = engine.workers[worker_id].process.pid
    assert pid is not None and pid > 0 and pid != os.getpid(), f"worker {worker_id} has no process to kill"
    os.kill(pid, signal.SIGKILL)


def test_killed_worker_is_detected_and_its_requests_rerun() -> None:
    engine = start("shm")
    try:
        ids = [engine.add_request(p, SAMPLED) for p in PROMPTS]
        results = {i: Completion(i) for i in ids}
        killed = False
        for _ in range(10_000):
            if not engine.has_unfinished():
                break
            for out in engine.step():
                results[out.request_id].add(out)
                if not killed and len(results[out.request_id].token_ids) >= 3:
                    kill_worker(engine, 1)
                    killed = True
        assert killed and engine.dead_workers == [1]
        assert [results[i].token_ids for i in ids] == colocated(SAMPLED)
    finally:
        engine.shutdown()


def test_a_worker_dead_before_its_death_is_noticed_gets_no_request() -> None:
    """A decode worker killed between two steps: requests placed on it meet a broken pipe, which buries the
    worker and places them again, instead of failing the engine's thread."""
    engine = start("shm", prefill=1, decode=2)
    try:
        engine.workers[2].process.kill()
        engine.workers[2].process.join(10)
        assert engine.workers[2].alive  # not noticed yet: no step ran
        assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == colocated(GREEDY)
        assert engine.dead_workers == [2]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("policy", ["query", "attention"])
def test_query_selection_gives_the_same_tokens_as_colocated(disaggregated: WorkerEngine,
                                                           policy: ScoredPolicy) -> None:
    """The `query` and `attention` policies cross the hand-off and pick the same blocks on the decode worker; the
    prefill's last chunk picks too (from the previous turn's block, `kept_from`), and its picks for the first decode
    step cross with the request."""
    selection = QuerySelection(budget=0.5, refresh_steps=2, sink_tokens=4, recent_tokens=16, policy=policy,
                               kept_from=64)
    prompts = [[1, *range(30, 30 + n)] for n in (79, 120)]
    params = replace(GREEDY, max_tokens=12, return_logits=True)

    def completions(engine: LLMEngine | WorkerEngine) -> list[Completion]:
        ids = [engine.add_request(p, params, selection=selection) for p in prompts]
        results = {request_id: Completion(request_id) for request_id in ids}
        while engine.has_unfinished():
            for out in engine.step():
                results[out.request_id].add(out)
        return [results[request_id] for request_id in ids]

    apart, together = completions(disaggregated), completions(LLMEngine("tiny", SETTINGS))
    assert [c.token_ids for c in apart] == [c.token_ids for c in together]
    for one, other in zip(apart, together, strict=True):  # the tiny model's tokens barely depend on the picks
        torch.testing.assert_close(torch.stack(one.logits), torch.stack(other.logits), atol=1e-5, rtol=0)
