"""Trace replay of Mooncake's format (predictor/data/README.md) as multi-turn chat sessions.

Each request arrives at its `timestamp` (ms) x time_scale. Lengths are `input_length` / `output_length` x
length_scale. Every `hash_ids` entry names a 512-token block, replayed as (512 x length_scale) single-token
words seeded by the hash id alone, so requests naming the same ids send the same text and prefix reuse in
the trace is prefix reuse in the engine.

Sessions come from the trace parser's prefix-trie grouping (`sessions_and_reuse`); a request whose blocks do
not extend its session's latest request (a branch) starts a session of its own. A session's first turn is
its first request's whole prompt: its blocks, the last one partial, cut to the scaled input length. A later
turn adds what the conversation gained beyond the previous request and its reply (input_k - input_{k-1} -
output_{k-1}, at least 1 token), as the text of its blocks from the first one the previous request lacked.
History is append-only. Sessions are then fitted to max_model_len (agents_eval.workloads.context).

There is no system message: the trace's shared first block opens every first turn instead.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from agents_eval.bench.trajectory.trace import block_length
from agents_eval.workloads.context import ContextFit
from agents_eval.workloads.synthetic import token_text
from agents_eval.workloads.text import TokenText, cut_words
from agents_eval.workloads.types import ACT, APPEND, THINK, SessionScript, Turn, Workload
from engine.model.tokenizer import Tokenizer
from predictor.traces import DEFAULT_TRACE, TraceRequest, load_trace, sessions_and_reuse

THINK_INPUT_PER_OUTPUT = 4  # a turn is "think" when its new tokens are at least this many times its output


def group_sessions(requests: Sequence[TraceRequest]) -> list[list[int]]:
    """Request indices per replayed session, in order of each session's first request."""
    trace_sessions, _ = sessions_and_reuse(list(requests))
    groups: list[list[int]] = []
    latest: dict[int, int] = {}  # trace session -> index into groups
    for index, (request, trace_session) in enumerate(zip(requests, trace_sessions, strict=True)):
        group = latest.get(trace_session)
        if group is not None and _extends(request, requests[groups[group][-1]]):
            groups[group].append(index)
        else:
            latest[trace_session] = len(groups)
            groups.append([index])
    return groups


def _extends(request: TraceRequest, previous: TraceRequest) -> bool:
    """The request starts with all of the previous one's full blocks (every id but its partial last)."""
    full = previous.hash_ids[:-1]
    return len(request.hash_ids) > len(full) and request.hash_ids[: len(full)] == full


class _Replay:
    """Turns of trace requests at one length scale, over one TokenText."""

    def __init__(self, requests: Sequence[TraceRequest], text: TokenText, length_scale: float,
                 time_scale: float) -> None:
        self.requests, self.text, self.time_scale = requests, text, time_scale
        self.length_scale = length_scale
        self.block_len = block_length(length_scale)
        self.clamped_turns = 0  # later turns whose trace lengths gave no new tokens

    def session(self, seed: int, number: int, indices: list[int]) -> SessionScript:
        turns = [self._first_turn(indices[0])]
        turns += [self._later_turn(prev, index) for prev, index in itertools.pairwise(indices)]
        start_s = turns[0].at_s if turns[0].at_s is not None else 0.0
        return SessionScript(f"mooncake-{seed}-{number:05d}", start_s, "", tuple(turns))

    def _input(self, index: int) -> int:
        request = self.requests[index]
        return min(max(1, round(request.input_length * self.length_scale)), len(request.hash_ids) * self.block_len)

    def _output(self, index: int) -> int:
        return max(1, round(self.requests[index].output_length * self.length_scale))

    def _first_turn(self, index: int) -> Turn:
        tokens = self._input(index)
        return self._turn(index, self._blocks_text(index, 0, tokens), tokens)

    def _later_turn(self, previous: int, index: int) -> Turn:
        gained = self._input(index) - self._input(previous) - self._output(previous)
        self.clamped_turns += gained < 1
        tokens = max(1, gained)
        return self._turn(index, self._blocks_text(index, _first_new_block(self.requests, previous, index), tokens),
                          tokens)

    def _blocks_text(self, index: int, first_block: int, tokens: int) -> str:
        """`tokens` words from the request's blocks starting at `first_block`, topped up by a block of its own."""
        hash_ids = self.requests[index].hash_ids[first_block: first_block + -(-tokens // self.block_len)]
        text = "".join(self.text.block(hash_id, self.block_len) for hash_id in hash_ids)
        missing = tokens - len(hash_ids) * self.block_len
        return cut_words(text, tokens) if missing <= 0 else text + self.text.block(("top-up", index), missing)

    def _turn(self, index: int, content: str, tokens: int) -> Turn:
        output = self._output(index)
        at_s = self.requests[index].timestamp_ms / 1000 * self.time_scale
        phase = THINK if tokens >= THINK_INPUT_PER_OUTPUT * output else ACT
        return Turn(at_s, 0.0, ({"role": "user", "content": content},), tokens, output, phase, APPEND, at_s)


def _first_new_block(requests: Sequence[TraceRequest], previous: int, index: int) -> int:
    old, new = requests[previous].hash_ids, requests[index].hash_ids
    return next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))


def build(*, seed: int = 0, trace: Path = DEFAULT_TRACE, rate: float | None = None, duration_s: float | None = None,
          max_requests: int | None = 200, length_scale: float = 1 / 16, time_scale: float = 1.0,
          tokenizer: Tokenizer | TokenText | None = None, max_model_len: int | None = 2048) -> Workload:
    """The first `max_requests` requests of a Mooncake-format trace as sessions, arriving at the trace's own
    times x time_scale, or, given `rate` (sessions per second), at times scaled so sessions start at that
    average rate. `duration_s` drops turns arriving after it. `max_model_len` defaults to the `tiny` model's
    context (configs/models/tiny.yaml), None for no limit."""
    if rate is not None and time_scale != 1.0:
        raise ValueError("give mooncake a rate or a time_scale, not both")
    requests = load_trace(trace, sys.maxsize if max_requests is None else max_requests)
    groups = group_sessions(requests)
    if rate is not None:
        time_scale = _time_scale_for_rate(requests, groups, rate)
    replay = _Replay(requests, token_text(tokenizer, seed), length_scale, time_scale)
    fit = ContextFit(max_model_len)
    sessions = fit.fit_all([replay.session(seed, number, group) for number, group in enumerate(groups)])
    settings: dict[str, object] = {
        "trace": str(trace), "seed": seed, "rate": rate, "duration_s": duration_s, "max_requests": max_requests,
        "length_scale": length_scale, "time_scale": time_scale, "max_model_len": max_model_len,
        "block_tokens": replay.block_len, "trace_requests": len(requests), "trace_sessions": len(groups),
        "clamped_turns": replay.clamped_turns, "think_input_per_output": THINK_INPUT_PER_OUTPUT,
        "context_fit": fit.counts.as_settings()}
    return Workload("mooncake", tuple(sessions), settings).truncate(duration_s=duration_s)


def _time_scale_for_rate(requests: Sequence[TraceRequest], groups: list[list[int]], rate: float) -> float:
    starts = [requests[group[0]].timestamp_ms / 1000 for group in groups]
    span = max(starts) - min(starts)
    return len(groups) / span / rate if span > 0 else 1.0
