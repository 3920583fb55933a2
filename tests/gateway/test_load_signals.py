"""What the gateway tells the capacity controller and records for the predictor: a session's turns through
real HTTP feed the think/act monitor and, opt-in, land in a JSONL recording the predictor reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx

from engine.config import EngineSettings
from engine.core.async_engine import AsyncLLMEngine
from engine.core.llm_engine import LLMEngine
from engine.core.stats import AgentSignals
from gateway.admission import AdmissionController
from gateway.auth import ANONYMOUS
from gateway.load_signals import PUSH_GATHER_S, LoadSignals
from gateway.server.app import create_app
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings
from predictor.forecast import LoadForecaster
from predictor.recording import read_recording
from predictor.records import TurnRecord
from tests.conftest import free_port
from tests.gateway.conftest import serving


def test_session_turns_are_recorded_and_observed(tmp_path: Path) -> None:
    recording = tmp_path / "sessions.jsonl"
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=4, record_sessions=str(recording))
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=512)))
    history = [{"role": "system", "content": "You fix bugs."}]
    with serving(app, settings.port) as url:
        for turn in range(3):
            history.append({"role": "user", "content": f"Observation {turn}: " + "tests failed. " * (5 + 20 * turn)})
            body = {"model": "tiny", "messages": history, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": "agent-7"},
                               timeout=60).raise_for_status().json()
            history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "no session", "max_tokens": 2})
        mix = app.state.gateway.signals.monitor.mix()
    lines = [json.loads(line) for line in recording.read_text().splitlines()]
    session = session_key(ANONYMOUS, "agent-7").path  # the session as its key owns it
    assert [line["session_id"] for line in lines] == [session] * 3  # raw completions are no agent turn
    assert [line["output_tokens"] for line in lines] == [4, 4, 4]
    assert all(line["new_tokens"] == line["prompt_tokens"] - line["cached_tokens"] for line in lines)
    assert lines[0]["tool_gap_s"] == 0 and all(line["tool_gap_s"] > 0 for line in lines[1:])
    assert lines[2]["cached_tokens"] > lines[1]["prompt_tokens"] // 2  # the session's KV was reused
    assert [t.phase for t in read_recording(recording)[session]] == [line["phase"] for line in lines]
    assert mix.turns_in_window == 3 and mix.active_decodes == 0


def test_a_turn_is_expected_to_decode_its_forecast_capped_at_max_tokens() -> None:
    forecaster = LoadForecaster()
    signals = LoadSignals(AsyncLLMEngine(LLMEngine("tiny", EngineSettings(num_kv_blocks=64))), 0.1, 1.0,
                          forecaster, None)
    assert signals.expected_output_tokens("agent-1", 256) == 256  # a session never seen: max_tokens
    forecaster.observe("agent-1", TurnRecord(500, 500, 0, 12, 0.0, "think"), 0.0)
    assert signals.expected_output_tokens("agent-1", 256) == 256  # not predicted before the next forecast
    forecaster.forecast(1.0, 0.0)
    predicted = forecaster.expected_output_tokens("agent-1")
    assert predicted is not None and 4 < predicted < 256
    assert signals.expected_output_tokens("agent-1", 256) == round(predicted)
    assert signals.expected_output_tokens("agent-1", 4) == 4
    assert signals.expected_output_tokens(None, 256) == 256


class DeliveryLog:
    """The engine seam LoadSignals pushes through: each `call` is one wake-up of the engine thread."""

    def __init__(self) -> None:
        self.engine = SimpleNamespace(capacity=object())  # a capacity controller reads the signals
        self.delivered: list[AgentSignals] = []

    def call(self, fn: Callable[[object], object]) -> None:
        fn(SimpleNamespace(update_signals=self.delivered.append))


def test_a_push_goes_at_once_and_those_within_its_window_ride_on_one_delivery_at_its_end() -> None:
    engine = DeliveryLog()
    signals = LoadSignals(engine, 0.1, 1.0, None, None)  # type: ignore[arg-type]
    admission = AdmissionController(ttft_slo_s=1.0, initial_prefill_tokens_per_s=1000.0)
    signals.watch(admission)

    def prompts() -> list[int]:
        return [s.admitted.prompts if s.admitted else -1 for s in engine.delivered]

    async def turns() -> None:
        for index in range(3):
            admission.on_admit(f"r{index}", 100, 10)
        assert prompts() == [1]  # the first at once, ahead of its turn; the other two wait for the window's end
        await asyncio.sleep(3 * PUSH_GATHER_S)
        assert prompts() == [1, 3]
        await asyncio.sleep(3 * PUSH_GATHER_S)  # the window closed with nothing gathered
        admission.on_first_token("r0")
        assert prompts() == [1, 3, 2]
        await signals.stop()

    asyncio.run(turns())
    admission.on_finish("r0")  # off an event loop: delivered at once
    assert prompts() == [1, 3, 2, 2] and engine.delivered[-1].admitted.streams == 2  # type: ignore[union-attr]
