"""Sparse history: token spans that later queries skip in attention, and the query-aware block selection.
Pure policy, no torch.

A masked span stays in the KV cache; only attention from positions in [from_position, until_position) skips
it (until_position None: for good), so a mask added at turn k leaves the KV of earlier turns valid and costs
nothing to recompute. The KV of a block depends on the spans in force when it was computed, so they are part
of the block's hash. A request's attended history blocks are spans at block granularity
(`spans_skipping_blocks`): attention gathers only the tokens its queries see, so a skipped block costs neither
reads nor FLOPs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from engine.kv_cache.manager import BlockKeys, ExtraKeys

# age: the caller's masked spans; query and attention: blocks scored by the engine (`QuerySelection.policy`)
SELECTION_POLICIES = ("age", "query", "attention")
ScoredPolicy = Literal["query", "attention"]


@dataclass(frozen=True)
class MaskedSpan:
    """Queries at positions in [from_position, until_position) do not attend to tokens [start, end)."""

    start: int
    end: int
    from_position: int
    until_position: int | None = None  # None: every later query skips it

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end or self.from_position < self.start:
            raise ValueError(f"invalid masked span {self}: need 0 <= start < end and from_position >= start")
        if self.until_position is not None and self.until_position <= self.from_position:
            raise ValueError(f"invalid masked span {self}: need until_position > from_position")

    def skips_for(self, position: int) -> bool:
        """Whether the query at this position skips the span."""
        return self.from_position <= position and (self.until_position is None or position < self.until_position)


@dataclass(frozen=True)
class QuerySelection:
    """The `query` (and `attention`) policy of a request: every `refresh_steps` decode steps the engine scores
    each history block by an upper bound of its keys' dot product with the step's queries (per-block key minima
    and maxima; `policy="attention"`: by the attention the request's queries gave it, accumulated) and
    attends to the best `budget` share of the history blocks from the next step on, plus the blocks it never
    skips: the first `sink_tokens`, the `kept` token ranges (tool-call headers, the current and previous turn)
    and the last `recent_tokens`."""

    budget: float = 0.5
    refresh_steps: int = 16
    sink_tokens: int = 4
    recent_tokens: int = 256
    kept: tuple[tuple[int, int], ...] = ()
    kept_from: int | None = None  # every position from here on (the previous and current turn)
    policy: ScoredPolicy = "query"
    # where the session's turns began picking (the end of its first reply): the same for every turn, so each
    # turn's blocks computed under picks are keyed alike and the next turn reuses them
    picked_from: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.budget <= 1.0 or self.refresh_steps < 1:
            raise ValueError(f"invalid query selection {self}: need 0 < budget <= 1 and refresh_steps >= 1")

    def kept_blocks(self, num_tokens: int, block_size: int) -> set[int]:
        """Blocks of the first num_tokens positions that are never skipped."""
        recent = max(0, num_tokens - max(1, self.recent_tokens))  # the query's own block at least
        ranges = [(0, self.sink_tokens), (recent, num_tokens), *self.kept]
        if self.kept_from is not None:
            ranges.append((self.kept_from, num_tokens))
        return {block for start, end in ranges for block in range(start // block_size, -(-min(end, num_tokens)
                                                                                          // block_size))}


    def skipped_blocks(self, scores: Sequence[float], position: int, block_size: int) -> list[int]:
        """The history blocks (the full blocks before the query at `position`, scored in order) that the next
        steps skip: all but the kept ones and the best-scored, so that `budget` of the history is attended."""
        kept = self.kept_blocks(position + 1, block_size)
        history = range(len(scores))
        room = max(0, round(self.budget * len(history)) - len(kept.intersection(history)))
        ranked = sorted((block for block in history if block not in kept), key=lambda block: -scores[block])
        return sorted(ranked[room:])

    @property
    def prefill_from(self) -> int | None:
        """From where the request's blocks are keyed by the policy (`block_keys`): `picked_from`, else `kept_from`;
        None: no prefill chunk picks."""
        return self.kept_from if self.picked_from is None else self.picked_from

    def chunk_history(self, start: int, end: int, block_size: int) -> tuple[list[bool], int] | None:
        """For a prefill chunk [start, end): which of the full history blocks before it are kept, and how many
        others each layer reads (so that `budget` of the history is attended); None when the chunk reads the whole
        history (before `prefill_from`, or nothing to skip)."""
        if self.kept_from is None or start < self.kept_from // block_size * block_size:
            return None
        history = start // block_size
        kept_set = self.kept_blocks(end, block_size)
        kept = [block in kept_set for block in range(history)]
        room = max(0, round(self.budget * history) - sum(kept))
        if room >= history - sum(kept):
            return None
        return kept, room

    def due(self, num_output_tokens: int) -> bool:
        """Whether the decode step of the last of these output tokens picks the blocks (the first does)."""
        return num_output_tokens >= 1 and (num_output_tokens - 1) % self.refresh_steps == 0


@dataclass
class HistoryCounters:
    """Cumulative picks of the engine-scored history policies, by policy: the picks made, the full history blocks
    held at those picks, and those the picks left attended (attended over held: the share of its history a
    decode step reads)."""

    picks: dict[str, int] = field(default_factory=dict)
    held_blocks: dict[str, int] = field(default_factory=dict)
    attended_blocks: dict[str, int] = field(default_factory=dict)

    def record(self, policy: str, held: int, attended: int) -> None:
        for counts, value in ((self.picks, 1), (self.held_blocks, held), (self.attended_blocks, attended)):
            counts[policy] = counts.get(policy, 0) + value

    def add(self, other: HistoryCounters) -> None:
        for mine, theirs in ((self.picks, other.picks), (self.held_blocks, other.held_blocks),
                             (self.attended_blocks, other.attended_blocks)):
            for policy, value in theirs.items():
                mine[policy] = mine.get(policy, 0) + value

    def copy(self) -> HistoryCounters:
        return HistoryCounters(dict(self.picks), dict(self.held_blocks), dict(self.attended_blocks))


def spans_skipping_blocks(blocks: Iterable[int], block_size: int, from_position: int,
                          until_position: int | None = None) -> list[MaskedSpan]:
    """Masked spans that skip these blocks (indices into the request's block table) for queries in
    [from_position, until_position); consecutive blocks make one span. Blocks past from_position are cut there."""
    spans: list[MaskedSpan] = []
    for block in sorted(set(blocks)):
        start, end = block * block_size, min((block + 1) * block_size, from_position)
        if start >= end:
            continue
        if spans and spans[-1].end == start:
            start = spans.pop().start
        spans.append(MaskedSpan(start, end, from_position, until_position))
    return spans


def block_keys(spans: Sequence[MaskedSpan], block_size: int, salt: str | None = None,
               selection: QuerySelection | None = None) -> ExtraKeys | BlockKeys:
    """Extra hash keys per block: the cache salt on the first (every later hash chains from it, so two salts
    share no block), the spans that shaped that block's KV, clipped to the block's end (so a span closed
    after a block's end keys that block as it did while open), and the selection's policy on the blocks a
    prefill computes under its picks (from the one holding `prefill_from` on): the picks depend on the chunk's
    queries, so such KV is shared with the policy's later turns, never with dense requests."""
    picked_from, policy = (None, "") if selection is None else (selection.prefill_from, selection.policy)
    if not spans and salt is None and picked_from is None:
        return ()
    salted: ExtraKeys = () if salt is None else (salt,)

    def keys(index: int) -> ExtraKeys:
        block_end = (index + 1) * block_size
        picked: ExtraKeys = () if picked_from is None or block_end <= picked_from else ("picked", policy)
        return (salted if index == 0 else ()) + picked + tuple(
            value for span in spans if span.from_position < block_end
            for value in (span.start, min(span.end, block_end), span.from_position,
                          min(span.until_position or block_end, block_end)))

    return keys
