"""The online forecaster the capacity controller reads: the next turn of every live session, summed.

Each session's next turn is predicted once after each of its turns (batched over all sessions with a new turn,
at the next `forecast` call) and cached. A session counts in a forecast when its predicted arrival (its last
turn's arrival plus the predicted gap) falls in `[now - overdue_s, now + horizon_s]`: a hard window, no
probability weighting; a turn that is late stays expected for `overdue_s`. A predicted turn is counted by the
forecasts of `overdue_s + horizon_s` seconds, a turn that came by those of `horizon_s`: a long `overdue_s`
inflates the sum. The default of 1 s pairs with the capacity controller's 1-s horizon; 30 s forecast four
times the load that came on the webarena recording (`agentserve predictor replay`).
Sessions never ended are dropped `expire_s` after their last turn. Calls come from one thread (the gateway's
event loop); there are no locks.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from predictor.evaluate import Choice, Errors, better_predictor
from predictor.features import Baseline, Baselines
from predictor.model import DEFAULT_MODEL, ModelFileError, NextTurnLSTM, load_metadata, load_model, predict
from predictor.records import Forecast, NextTurn, PredictorInputError, TurnRecord


class _Expected(NamedTuple):
    turn: NextTurn
    arrival: float


@dataclass
class _LiveSession:
    turns: deque[TurnRecord]
    baselines: Baselines
    last_arrival: float = 0.0
    expected: _Expected | None = None  # None until predicted after the latest turn


class LoadForecaster:
    """`model_path=None` loads the shipped model. The LSTM runs only when the model's metadata shows it beat
    both baselines on held-out sessions; otherwise the better baseline predicts (see `uses`)."""

    DEFAULT_OVERDUE_S = 1.0

    def __init__(self, model_path: Path | None = None, overdue_s: float = DEFAULT_OVERDUE_S,
                 expire_s: float = 3600.0) -> None:
        path = DEFAULT_MODEL if model_path is None else model_path
        metadata = load_metadata(path)
        try:
            prefill = Errors(**metadata["heldout"]["mae"])
            self.fallback_gap_s = float(metadata["fallback_gap_s"])
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"model metadata lacks held-out errors: {path}") from None
        self.uses: Choice = better_predictor(prefill)
        self.reason = (f"held-out prefill-token MAE: lstm {prefill.predictor:.0f}, "
                       f"last_value {prefill.last_value:.0f}, ema {prefill.ema:.0f}")
        self._model: NextTurnLSTM | None = load_model(path)[0] if self.uses == "lstm" else None
        self._window = self._model.config.window if self._model is not None else 1
        self.overdue_s = overdue_s
        self.expire_s = expire_s
        self._sessions: dict[str, _LiveSession] = {}

    def observe(self, session_id: str, turn: TurnRecord, t: float) -> None:
        """After each turn: `t` is the turn's arrival time, on the clock `forecast(now=...)` uses."""
        session = self._sessions.get(session_id)
        if session is None:
            session = _LiveSession(deque(maxlen=self._window), Baselines(self.fallback_gap_s))
            self._sessions[session_id] = session
        session.turns.append(turn)
        session.baselines.observe(turn)
        session.last_arrival = t
        session.expected = None

    def expected_output_tokens(self, session_id: str) -> float | None:
        """The output tokens predicted for the session's next turn; None until predicted (at a `forecast`)."""
        session = self._sessions.get(session_id)
        return None if session is None or session.expected is None else session.expected.turn.output_tokens

    def end_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    def forecast(self, horizon_s: float, now: float) -> Forecast:
        """The prefill and decode tokens of the next turns expected to arrive by `now + horizon_s`."""
        if not math.isfinite(horizon_s) or horizon_s < 0:
            raise PredictorInputError(f"horizon_s must be a finite number of seconds >= 0, got {horizon_s}")
        self._expire(now)
        self._refresh()
        prefill = decode = 0.0
        counted = 0
        for session in self._sessions.values():
            expected = session.expected
            if expected is not None and now - self.overdue_s <= expected.arrival <= now + horizon_s:
                prefill += expected.turn.new_tokens
                decode += expected.turn.output_tokens
                counted += 1
        return Forecast(prefill_tokens=prefill, decode_tokens=decode, sessions=counted)

    def _expire(self, now: float) -> None:
        expired = [key for key, session in self._sessions.items() if now - session.last_arrival > self.expire_s]
        for key in expired:
            del self._sessions[key]

    def _refresh(self) -> None:
        stale = [session for session in self._sessions.values() if session.expected is None]
        if not stale:
            return
        if self._model is not None:
            predicted = predict(self._model, [list(session.turns) for session in stale])
        else:
            baseline: Baseline = "ema" if self.uses == "ema" else "last_value"
            predicted = [session.baselines.predict(baseline) for session in stale]
        for session, next_turn in zip(stale, predicted, strict=True):
            session.expected = _Expected(next_turn, session.last_arrival + next_turn.gap_s)
