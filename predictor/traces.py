"""Training and evaluation data: Mooncake-format traces and gateway recordings, as sessions of `TurnRecord`s.

Mooncake sessions: a request continues an earlier one when it starts with all of that one's full blocks (every
id but its last, which is partial and renamed as the conversation grows). The first block is shared by every
request of the conversation trace (a common system prompt), so a continuation must share at least two blocks.
A turn's new tokens are its input length minus the tokens in the leading blocks it shares with the session's
previous request; its gap is the difference of their timestamps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from predictor.recording import read_recording
from predictor.records import PredictorInputError, TurnRecord, phase_of

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"  # see its README.md
TRACE_BLOCK_TOKENS = 512
MIN_SHARED_BLOCKS = 2
ROOT = 0
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")

Sessions = dict[str, list[TurnRecord]]
TraceKind = Literal["mooncake", "recording"]


class TraceFormatError(PredictorInputError):
    """A trace file that is missing or is neither a Mooncake trace nor a gateway recording."""


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _request(row: Any) -> TraceRequest:
    if not isinstance(row, dict) or any(field not in row for field in MOONCAKE_FIELDS):
        raise ValueError(f"a Mooncake line needs {', '.join(MOONCAKE_FIELDS)}")
    if not all(_is_count(row[field]) for field in MOONCAKE_FIELDS[:3]):
        raise ValueError("timestamp, input_length and output_length must be non-negative integers")
    hash_ids = row["hash_ids"]
    if not isinstance(hash_ids, list) or not hash_ids or not all(_is_count(h) for h in hash_ids):
        raise ValueError("hash_ids must be a non-empty list of non-negative integers")
    return TraceRequest(row["timestamp"], row["input_length"], row["output_length"], tuple(hash_ids))


def load_trace(path: Path, max_requests: int | None = None) -> list[TraceRequest]:
    """The requests of a Mooncake-format trace, in file order."""
    requests: list[TraceRequest] = []
    with _open(path) as lines:
        for number, line in enumerate(lines, start=1):
            if len(requests) == max_requests:
                break
            if not line.strip():
                continue
            try:
                requests.append(_request(json.loads(line)))
            except ValueError as error:  # json.JSONDecodeError is one
                raise TraceFormatError(f"{path}:{number}: {_reason(error)}") from None
    return requests


def sessions_and_reuse(requests: Sequence[TraceRequest]) -> tuple[list[int], list[int]]:
    """Per request: its session index, and how many of its leading blocks an earlier request had."""
    nodes: dict[tuple[int, int], int] = {}  # (parent prefix, hash id) -> prefix id: a trie of block prefixes
    owners: dict[int, int] = {}  # prefix id -> session of the request that ended there (or one block later)
    sessions, reused = [], []
    next_session = 0
    for request in requests:
        path: list[int] = []
        seen, parent = 0, ROOT
        for hash_id in request.hash_ids:
            seen += (parent, hash_id) in nodes and seen == len(path)
            parent = nodes.setdefault((parent, hash_id), len(nodes) + 1)
            path.append(parent)
        continued = [owners[prefix] for prefix in path[MIN_SHARED_BLOCKS - 1:] if prefix in owners]
        session = continued[-1] if continued else next_session
        next_session += not continued
        owners.update({prefix: session for prefix in path[max(MIN_SHARED_BLOCKS, len(path) - 1) - 1:]})
        sessions.append(session)
        reused.append(seen)
    return sessions, reused


def _shared_tokens(previous: TraceRequest, request: TraceRequest) -> int:
    blocks = 0
    for mine, theirs in zip(request.hash_ids, previous.hash_ids, strict=False):
        if mine != theirs:
            break
        blocks += 1
    return min(blocks * TRACE_BLOCK_TOKENS, previous.input_length, request.input_length)


def _turn(previous: TraceRequest | None, request: TraceRequest) -> TurnRecord:
    cached = _shared_tokens(previous, request) if previous else 0
    gap_s = (request.timestamp_ms - previous.timestamp_ms) / 1000 if previous else 0.0
    new_tokens = request.input_length - cached
    return TurnRecord(new_tokens=new_tokens, prompt_tokens=request.input_length, cached_tokens=cached,
                      output_tokens=request.output_length, tool_gap_s=max(0.0, gap_s),
                      phase=phase_of(new_tokens, request.output_length))


def mooncake_sessions(requests: Sequence[TraceRequest]) -> dict[int, list[TurnRecord]]:
    """The trace's sessions, each its turns in trace order."""
    sessions: dict[int, list[TurnRecord]] = {}
    last: dict[int, TraceRequest] = {}
    for request, session in zip(requests, sessions_and_reuse(requests)[0], strict=True):
        sessions.setdefault(session, []).append(_turn(last.get(session), request))
        last[session] = request
    return sessions


def trace_kind(path: Path) -> TraceKind:
    """Whether a file is a Mooncake trace or a gateway recording, from its first line."""
    with _open(path) as lines:
        first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise TraceFormatError(f"{path}: the file is empty")
    try:
        row = json.loads(first)
    except ValueError:
        row = None
    if isinstance(row, dict) and "hash_ids" in row:
        return "mooncake"
    if isinstance(row, dict) and "session_id" in row:
        return "recording"
    raise TraceFormatError(f"{path}: neither a Mooncake trace nor a gateway recording (first line has "
                           f"neither hash_ids nor session_id)")


def load_sessions(paths: Sequence[Path]) -> Sessions:
    """The sessions of all files, keyed `<file index>/<session>` so files never merge sessions."""
    if not paths:
        raise TraceFormatError("no trace given (pass --trace FILE)")
    sessions: Sessions = {}
    for index, path in enumerate(paths):
        found: dict[Any, list[TurnRecord]]
        if trace_kind(path) == "mooncake":
            found = dict(mooncake_sessions(load_trace(path)))
        else:
            found = dict(read_recording(path))
        sessions.update({f"{index}/{key}": turns for key, turns in found.items()})
    return sessions


def file_of(key: str) -> str:
    """The file part of a `load_sessions` key: the file's index, as text."""
    return key.partition("/")[0]


def file_sessions(sessions: Sessions, index: int) -> list[list[TurnRecord]]:
    """The sessions that came from the `index`-th file given to `load_sessions`."""
    return [turns for key, turns in sessions.items() if file_of(key) == str(index)]


def portable_path(path: Path) -> str:
    """A file's name for model metadata and reports: relative to the repository when inside it (so a model's
    training files are found in any checkout), else absolute."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(resolved)


def resolve_path(name: str) -> Path:
    """The file a `portable_path` name stands for."""
    path = Path(name)
    return path if path.is_absolute() else REPO_ROOT / path


def _open(path: Path) -> Any:
    if not path.is_file():
        raise TraceFormatError(f"trace not found: {path}")
    return path.open(encoding="utf-8")


def _reason(error: ValueError) -> str:
    return "not JSON" if isinstance(error, json.JSONDecodeError) else str(error)
