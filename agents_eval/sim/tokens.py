"""Token ids for simulated requests, and a `Sequence` whose `all_token_ids` is a view, not a copy.

The engine's `Sequence.all_token_ids` concatenates prompt and outputs on every call: the scheduler asks for it
once per sequence per step, which at agent context lengths (tens of thousands of tokens) would cost the
simulator more than everything else. `SimSequence` returns a read-only view of the same tokens instead; the
policy objects only take its length and slices, so they behave exactly as on the engine's lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from collections.abc import Sequence as SequenceABC
from typing import overload

from engine.core.sequence import Sequence


class TokenView(SequenceABC[int]):
    __slots__ = ("_head", "_tail")

    def __init__(self, head: list[int], tail: list[int]) -> None:
        self._head, self._tail = head, tail

    @property
    def head(self) -> list[int]:
        return self._head

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        split = len(self._head)
        if isinstance(index, int):
            index = index + len(self) if index < 0 else index
            return self._head[index] if index < split else self._tail[index - split]
        if index.step is None and index.stop is not None and 0 <= (index.start or 0) <= index.stop <= split:
            return self._head[index]  # the common case: a block of the prompt
        start, stop, step = index.indices(len(self))
        if step != 1:
            return list(self)[index]
        if stop <= split:
            return self._head[start:stop]
        head = self._head if start == 0 else self._head[start:split]  # a whole history: one copy, not two
        return head + self._tail[max(0, start - split):stop - split]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self._head, self._tail)


class SimSequence(Sequence):
    @property
    def all_token_ids(self) -> list[int]:
        return TokenView(self.prompt_token_ids, self.output_token_ids)  # type: ignore[return-value]


class TokenIds:
    """Fresh token ids: every simulated token is distinct unless it is shared on purpose (a system prompt, a
    session's history), so prefix caching finds exactly the reuse the workload has."""

    def __init__(self, start: int = 1 << 20) -> None:
        self._next = start

    def fresh(self, count: int) -> list[int]:
        self._next += count
        return list(range(self._next - count, self._next))

    def one(self) -> int:
        self._next += 1
        return self._next - 1
