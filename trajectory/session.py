"""One agent session's state and its compact serialised form (what the gateway's store keeps).

Layout of `to_bytes()`: zlib-compressed JSON with a format version. Timestamps are wall-clock seconds
(`time.time()`), so a session restored in another process continues where it stopped. The rendered history,
the bulk of a long session, is append-only: a state serialised before keeps its history encoded and
compressed (`HistoryEncoder`), so the next `to_bytes()` encodes and compresses only the turns added since.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from engine import MaskedSpan
from trajectory.json_codec import dumps, loads
from trajectory.template.incremental import RenderedTurn
from trajectory.template.types import Message

FORMAT_VERSION = 1
COMPRESSION = (6, zlib.DEFLATED, 12, 5)  # level, method, window bits, memory level: a 40 KB compressor


@dataclass
class TurnRecord:
    """Where one message sits in the session's token ids, and what was done to it on ingest."""

    role: str
    token_start: int
    token_end: int
    tool: str | None = None  # the tool whose result this is
    observation: bool = False  # pruned on ingest and maskable (`trajectory.observations`)
    tokens_before_pruning: int | None = None  # None: not pruned
    phase: str | None = None  # think | act, for the turn this message opened
    confidence: float | None = None
    at: float = 0.0

    def block_range(self, block_size: int) -> tuple[int, int]:
        """KV blocks this turn added to: [first, last + 1)."""
        return self.token_start // block_size, -(-self.token_end // block_size)


@dataclass
class ToolGap:
    """Moving average of the time between a reply calling this tool and the next turn arriving."""

    ema_s: float
    count: int = 1


@dataclass
class SessionState:
    session_id: str
    rendered: list[RenderedTurn] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    masked_spans: list[MaskedSpan] = field(default_factory=list)
    tool_gaps: dict[str, ToolGap] = field(default_factory=dict)
    pending_tools: list[str] = field(default_factory=list)  # tools called by the last reply
    reply_finished_at: float | None = None
    announced_tool: tuple[str, float, float | None] | None = None  # (name, started_at, estimated seconds)
    prefix_stable: bool = True
    client_digests: list[str] = field(default_factory=list)  # the messages as the client sent/saw them
    response_ids: list[str] = field(default_factory=list)  # Responses API: the response that ended each turn
    _history: HistoryEncoder | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def token_ids(self) -> list[int]:
        return [token_id for turn in self.rendered for token_id in turn.token_ids]

    @property
    def num_tokens(self) -> int:
        return sum(len(turn.token_ids) for turn in self.rendered)

    @property
    def output_lengths(self) -> list[int]:
        return [t.token_end - t.token_start for t in self.turns if t.role == "assistant"]

    def to_bytes(self) -> bytes:
        history = self._history
        if history is None or not history.continues(self):
            history = self._history = HistoryEncoder(self.session_id)
        history.extend(self.rendered)
        return history.finish(dumps(self._rest_to_json())[1:])

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionState:
        """The state `to_bytes` wrote; ValueError for anything else (corrupt, cut short, another version)."""
        try:
            payload = loads(zlib.decompress(data))
        except (zlib.error, ValueError, RecursionError) as error:
            raise ValueError(f"session data is not compressed JSON: {error}") from None
        version = payload.get("version") if isinstance(payload, dict) else None
        if version != FORMAT_VERSION:
            raise ValueError(f"session format version {version} is not {FORMAT_VERSION}")
        try:
            return cls._from_json(payload)
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"session data is malformed: {error!r}") from None

    @classmethod
    def _from_json(cls, payload: dict[str, Any]) -> SessionState:
        return cls(
            session_id=payload["session_id"],
            rendered=[_turn_from_json(t) for t in payload["rendered"]],
            turns=[_record_from_json(t) for t in payload["turns"]],
            masked_spans=[MaskedSpan(*span) for span in payload["masked_spans"]],
            tool_gaps={name: ToolGap(**gap) for name, gap in payload["tool_gaps"].items()},
            pending_tools=payload["pending_tools"],
            reply_finished_at=payload["reply_finished_at"],
            announced_tool=tuple(payload["announced_tool"]) if payload["announced_tool"] else None,
            prefix_stable=payload["prefix_stable"],
            client_digests=payload["client_digests"],
            response_ids=payload.get("response_ids", []),  # absent from sessions stored before it was kept
        )

    def _rest_to_json(self) -> dict[str, Any]:
        """Every field but the version, the session id and the rendered history (`HistoryEncoder`'s)."""
        return {
            "turns": [vars(turn) for turn in self.turns],
            "masked_spans": [[s.start, s.end, s.from_position] for s in self.masked_spans],
            "tool_gaps": {name: vars(gap) for name, gap in self.tool_gaps.items()},
            "pending_tools": self.pending_tools,
            "reply_finished_at": self.reply_finished_at,
            "announced_tool": list(self.announced_tool) if self.announced_tool else None,
            "prefix_stable": self.prefix_stable,
            "client_digests": self.client_digests,
            "response_ids": self.response_ids,
        }


def _record_from_json(data: dict[str, Any]) -> TurnRecord:
    """Sessions stored before `observation` was recorded counted tool messages only."""
    return TurnRecord(**{"observation": data["role"] == "tool", **data})


class HistoryEncoder:
    """The start of a state's serialised form, `{"version":..,"session_id":..,"rendered":[turn,...`, compressed
    so far and kept open: later calls add the turns appended since, then finish a copy with the other fields."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._compressor = zlib.compressobj(*COMPRESSION)
        self._compressed: list[bytes] = []
        self._turns: list[RenderedTurn] = []
        self._write(b'{"version":' + dumps(FORMAT_VERSION) + b',"session_id":' + dumps(session_id) + b',"rendered":[')

    def continues(self, state: SessionState) -> bool:
        """Whether `state`'s history still starts with the turns encoded (the same objects: turns are frozen)."""
        done = len(self._turns)
        return (state.session_id == self.session_id and len(state.rendered) >= done
                and all(a is b for a, b in zip(self._turns, state.rendered[:done], strict=True)))

    def extend(self, rendered: list[RenderedTurn]) -> None:
        for turn in rendered[len(self._turns):]:
            self._write((b"," if self._turns else b"") + dumps(_turn_to_json(turn)))
            self._turns.append(turn)

    def finish(self, rest: bytes) -> bytes:
        """The whole record: the history so far, then `rest` (the other fields, an object's inside and `}`)."""
        closing = self._compressor.copy()
        return b"".join([*self._compressed, closing.compress(b"]," + rest), closing.flush()])

    def _write(self, data: bytes) -> None:
        out = self._compressor.compress(data)
        if out:
            self._compressed.append(out)


def _turn_to_json(turn: RenderedTurn) -> dict[str, Any]:
    return {"message": turn.message.to_dict(), "text": turn.text, "ids": turn.token_ids}


def _turn_from_json(data: dict[str, Any]) -> RenderedTurn:
    return RenderedTurn(Message.from_openai(data["message"]), data["text"], tuple(data["ids"]))
