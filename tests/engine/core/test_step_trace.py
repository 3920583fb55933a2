"""The engine's step trace (`EngineSettings.step_trace_dir`): one line per step with its time, its thread's CPU
time, the idle gap before it and its batch as scheduled, in a file per engine process; off by default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.step_trace import read_steps
from engine.workers.coordinator.worker_engine import colocated_engine

SETTINGS = dict(num_kv_blocks=128, block_size=8, max_num_batched_tokens=16)
PROMPTS = [[1, *range(30, 30 + n)] for n in (5, 21)]
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def test_every_step_is_traced_with_the_batch_it_computed(tmp_path: Path) -> None:
    engine = LLMEngine("tiny", EngineSettings(**SETTINGS, step_trace_dir=str(tmp_path)))
    engine.generate(PROMPTS, PARAMS)
    engine.shutdown()
    steps = read_steps(tmp_path)
    assert list(steps) == [os.getpid()]
    traced = steps[os.getpid()]
    # every prompt token and every reply token but the last was computed once, in some step
    assert sum(new for step in traced for new, _, _ in step.batch) == sum(len(p) + PARAMS.max_tokens - 1
                                                                          for p in PROMPTS)
    assert sum(samples for step in traced for _, _, samples in step.batch) == len(PROMPTS) * PARAMS.max_tokens
    assert max(new for step in traced for new, _, _ in step.batch) <= SETTINGS["max_num_batched_tokens"]
    # the 22-token prompt in chunks of at most 16: its second chunk starts where the first ended
    longest = [cached for step in traced for new, cached, _ in step.batch if new > 1]
    assert 0 in longest and any(cached > 0 for cached in longest)
    assert traced[0].idle_s is None and all(step.idle_s is not None and step.idle_s >= 0 for step in traced[1:])
    assert all(step.seconds > 0 for step in traced)
    # the engine thread's CPU time within the step: never more than its wall time (torch's own threads aside)
    assert all(step.cpu_s is not None and 0 < step.cpu_s <= step.seconds + 1e-3 for step in traced)
    assert [step.start for step in traced] == sorted(step.start for step in traced)
    assert read_steps(tmp_path, since=traced[-1].start)[os.getpid()] == [traced[-1]]


def test_no_trace_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    engine = LLMEngine("tiny", EngineSettings(**SETTINGS))
    assert engine.trace is None
    engine.generate(PROMPTS[:1], PARAMS)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_worker_process_traces_its_own_steps(tmp_path: Path) -> None:
    engine = colocated_engine("tiny", EngineSettings(**SETTINGS, step_trace_dir=str(tmp_path)))
    try:
        engine.generate(PROMPTS, PARAMS)
        pid = engine.workers[0].process.pid
    finally:
        engine.shutdown()
    steps = read_steps(tmp_path)
    assert list(steps) == [pid] and pid != os.getpid()
    assert sum(samples for step in steps[pid] for _, _, samples in step.batch) == len(PROMPTS) * PARAMS.max_tokens
