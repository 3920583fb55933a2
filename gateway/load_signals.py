"""The agents' load as the gateway sees it, for the engine's capacity controller: every turn feeds the
think/act mix monitor (whose phase-shift events go to the engine at once), the next-turn forecaster and,
opt-in, a JSONL recording of session statistics for training the predictor. Every `interval_s` (the
capacity controller's) the mix and the forecast for the next `horizon_s` are pushed to the engine. The
admission ledger's work admitted and not yet served (`watch`) is pushed at once on every change: it is the
controller's demand signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from engine import AgentSignals, AsyncLLMEngine
from gateway.admission import AdmissionController
from predictor.forecast import LoadForecaster
from predictor.recording import SessionRecorder
from predictor.records import TurnRecord
from trajectory.phase.classifier import PhaseConfig, PhaseEstimate, PhaseShiftEvent
from trajectory.phase.monitor import PhaseMixMonitor

log = logging.getLogger(__name__)
SHIFT_PHASE = {"to_think": "think", "to_act": "act"}
MAX_SESSIONS = 100_000  # sessions whose last arrival is kept (for the tool gap); the least recent go first
PUSH_GATHER_S = 0.02  # at most one push to the controller this often; its goals are 500 ms (100 ms p50)


class LoadSignals:
    def __init__(self, engine: AsyncLLMEngine, interval_s: float, horizon_s: float,
                 forecaster: LoadForecaster | None, recording: Path | None, *, session_ttl_s: float = 3600.0) -> None:
        self.engine, self.interval_s, self.horizon_s, self.forecaster = engine, interval_s, horizon_s, forecaster
        self.session_ttl_s = session_ttl_s  # a session silent this long has expired: its arrival is dropped
        self.recorder = SessionRecorder(recording) if recording else None
        self.monitor = PhaseMixMonitor(PhaseConfig.load())
        self.monitor.subscribe(self._on_shift)
        self.last_shift: PhaseShiftEvent | None = None
        self.last_arrival: OrderedDict[str, float] = OrderedDict()  # least recently seen session first
        self.admission: AdmissionController | None = None
        self._pushed = AgentSignals()
        self._window: asyncio.TimerHandle | None = None  # open while pushes ride on one delivery at its end
        self._gathered = False  # a push came within the open window
        self.failures = 0  # pushes that failed
        self._task: asyncio.Task[None] | None = None

    def watch(self, admission: AdmissionController) -> None:
        """Report this ledger's admitted work with the signals, and push it to the engine whenever it changes."""
        self.admission = admission
        admission.subscribe(self._on_admission)

    def expected_output_tokens(self, session_id: str | None, max_tokens: int) -> int:
        """What a turn is expected to decode: the predictor's forecast for the session's next turn, at most
        `max_tokens`; `max_tokens` when there is no forecast (no session, no predictor, not yet predicted)."""
        predicted = None
        if session_id is not None and self.forecaster is not None:
            predicted = self.forecaster.expected_output_tokens(session_id)
        return max_tokens if predicted is None else max(1, min(max_tokens, round(predicted)))

    def turn_started(self, session_id: str, estimate: PhaseEstimate, prefill_tokens: int) -> None:
        self.monitor.observe_turn(session_id, estimate, prefill_tokens)
        self.monitor.decode_started(session_id)

    def turn_finished(self, session_id: str, arrived: float, turn: TurnRecord) -> None:
        """`arrived`: monotonic time the turn came in; `turn.tool_gap_s` is filled here from the session's
        previous arrival."""
        self.monitor.decode_finished(session_id)
        previous = self.last_arrival.pop(session_id, None)
        self.last_arrival[session_id] = arrived
        horizon = arrived - self.session_ttl_s  # the session just stored is never past it: the loop ends
        while len(self.last_arrival) > MAX_SESSIONS or next(iter(self.last_arrival.values())) < horizon:
            self.last_arrival.popitem(last=False)  # the least recent, or a session that has expired
        gap = 0.0 if previous is None else max(0.0, arrived - previous)
        record = TurnRecord(turn.new_tokens, turn.prompt_tokens, turn.cached_tokens, turn.output_tokens, gap,
                            turn.phase)
        if self.forecaster is not None:
            self.forecaster.observe(session_id, record, arrived)
        if self.recorder is not None:  # the arrival on the wall clock, as recordings keep it
            self.recorder.record(session_id, record, time.time() - (time.monotonic() - arrived))

    def signals(self, now: float) -> AgentSignals:
        forecast = self.forecaster.forecast(self.horizon_s, now) if self.forecaster is not None else None
        shift = self.last_shift
        signals = AgentSignals(self.monitor.mix(now).think_share, SHIFT_PHASE[shift.direction] if shift else None,
                               shift.timestamp if shift else None, forecast.prefill_tokens if forecast else 0.0,
                               forecast.decode_tokens if forecast else 0.0)
        return self._with_admitted(signals)

    def _with_admitted(self, signals: AgentSignals) -> AgentSignals:
        if self.admission is None:
            return signals
        return replace(signals, admitted=self.admission.admitted, admitted_total=self.admission.admitted_total)

    def _on_admission(self) -> None:
        """The latest mix and forecast as pushed, with the new admitted work: no forecast is run per turn."""
        if self.steered:
            self._send(self._with_admitted(self._pushed))

    def _on_shift(self, event: PhaseShiftEvent) -> None:
        self.last_shift = event
        log.info("phase shift %s: think share %.2f -> %.2f", event.direction, event.think_share_before,
                 event.think_share_after)
        self._push(time.monotonic())

    @property
    def steered(self) -> bool:
        """Whether the engine has a capacity controller to read the signals (a colocated one has none)."""
        return self.engine.engine.capacity is not None

    def _push(self, now: float) -> None:
        if self.steered:  # else nothing reads them: don't wake the engine thread for nothing
            self._send(self.signals(now))

    def _send(self, signals: AgentSignals) -> None:
        """At most one delivery to the engine thread every PUSH_GATHER_S: a push outside a window goes at once (ahead
        of its turn's placement) and opens one; pushes inside it ride on one delivery of the latest signals at its
        end. Each delivery wakes the engine thread, and a request pushes three times (admitted, first token,
        finished): at 16 sessions/s a delivery per push was 14% of the gateway's profile samples."""
        self._pushed = signals
        if self._window is not None:
            self._gathered = True
            return
        self._deliver()
        with contextlib.suppress(RuntimeError):  # off an event loop (a test driving this directly): no window
            self._window = asyncio.get_running_loop().call_later(PUSH_GATHER_S, self._close_window)

    def _close_window(self) -> None:
        self._window = None
        if self._gathered:
            self._gathered = False
            self._send(self._pushed)

    def _deliver(self) -> None:
        pushed = self._pushed
        self.engine.call(lambda engine: engine.update_signals(pushed))

    def start(self) -> None:
        if self.steered:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self._push(time.monotonic())
            except Exception:  # a forecast failure must not stop the pushes
                self.failures += 1
                log.exception("could not compute the load signals")

    def forecaster_in_use(self) -> tuple[str, str]:
        """The forecaster the capacity controller reads, and why (`/metrics`)."""
        if self.forecaster is None:
            return "none", "no capacity controller reads a forecast (colocated engine)"
        return self.forecaster.uses, self.forecaster.reason

    async def stop(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.recorder is not None:
            self.recorder.close()
