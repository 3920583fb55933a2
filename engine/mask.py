"""Sparse history masks: token spans that later queries skip in attention. Pure policy, no torch.

A masked span stays in the KV cache; only attention from positions at or after `from_position` skips it,
so a mask added at turn k leaves the KV of earlier turns valid and costs nothing to recompute. The KV of
a block depends on the spans in force when it was computed, so they are part of the block's hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.block_manager import BlockKeys, ExtraKeys


@dataclass(frozen=True)
class MaskedSpan:
    """Queries at positions >= from_position do not attend to tokens [start, end)."""

    start: int
    end: int
    from_position: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end or self.from_position < self.start:
            raise ValueError(f"invalid masked span {self}: need 0 <= start < end and from_position >= start")


def block_keys(spans: Sequence[MaskedSpan], block_size: int, salt: str | None = None) -> ExtraKeys | BlockKeys:
    """Extra hash keys per block: the cache salt on the first (every later hash chains from it, so two salts
    share no block), and the spans that shaped that block's KV, clipped to the block's end."""
    if not spans and salt is None:
        return ()
    salted: ExtraKeys = () if salt is None else (salt,)

    def keys(index: int) -> ExtraKeys:
        block_end = (index + 1) * block_size
        return (salted if index == 0 else ()) + tuple(
            value for span in spans if span.from_position < block_end
            for value in (span.start, min(span.end, block_end), span.from_position))

    return keys
