"""The engine's `KVCacheManager` with its chained block hashes remembered across the cluster.

A simulated turn's history is hashed over and over: looked up on the worker it lands on, hashed again as its
blocks fill, again on the decode worker its KV is handed to, and again at the session's next turn. The hash
is a pure function of (parent hash, block tokens, extra keys), so `SimKVCacheManager` looks it up in a table
the cluster's workers share and calls the engine's own `hash_block_tokens` only on a miss. Before the table
it asks the prompt itself: a `Prompt` keeps the chain of its leading full blocks (no extra keys) as far as
any worker hashed it, and the session's next prompt, which starts with it, starts with that chain. It
overrides nothing else: allocation, prefix lookup, eviction and pins are the engine's code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from agents_eval.sim.tokens import TokenView
from engine.kv_cache.manager import BlockKeys, ExtraKeys, KVCacheManager, hash_block_tokens


class BlockHashes:
    """Chain hashes already computed, by (parent hash, block tokens, extra keys); emptied when it reaches
    `capacity` entries, to bound its memory (the repeats come within a turn or at the session's next one,
    minutes apart at most)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._known: dict[tuple[int | None, tuple[int, ...], ExtraKeys], int] = {}

    def hash(self, parent: int | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys) -> int:
        known = self._known.get((parent, token_ids, extra_keys))
        return self._add(parent, token_ids, extra_keys) if known is None else known

    def _add(self, parent: int | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys) -> int:
        if len(self._known) >= self.capacity:
            self._known.clear()
        known = self._known[(parent, token_ids, extra_keys)] = hash_block_tokens(parent, token_ids, extra_keys)
        return known


class Prompt(list[int]):
    """A prompt's tokens and `block_hashes`: the chain hashes of its first full blocks of `block_size` tokens
    without extra keys, as far as they are known (a prompt's tokens never change once built)."""

    __slots__ = ("block_hashes", "block_size")

    def __init__(self, block_size: int, *parts: list[int], block_hashes: list[int] | None = None) -> None:
        super().__init__()
        for part in parts:
            self += part
        self.block_size, self.block_hashes = block_size, list(block_hashes or ())

    def then(self, *parts: list[int]) -> Prompt:
        """The prompt of a later turn: this one followed by `parts`, its known block hashes included."""
        return Prompt(self.block_size, self, *parts, block_hashes=self.block_hashes)


class SimKVCacheManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, hashes: BlockHashes) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.hashes = hashes

    def _block_hashes(self, token_ids: Sequence[int], extra_keys: ExtraKeys | BlockKeys, parent: int | None,
                      start: int, stop: int) -> Iterator[int]:
        size = self.block_size
        chain, limit = _prompt_chain(token_ids, extra_keys, size)
        tokens, first = None, start  # the range's tokens, copied at its first block the chain does not hold
        for index in range(start, stop):
            continues = index <= len(chain) and parent == (chain[index - 1] if index else None)
            if continues and index < len(chain):
                parent = chain[index]
            else:
                if tokens is None:
                    tokens, first = token_ids[index * size:stop * size], index  # a view's slices cost a call each
                offset = (index - first) * size
                keys = extra_keys(index) if callable(extra_keys) else extra_keys
                parent = self.hashes.hash(parent, tuple(tokens[offset:offset + size]), keys)
                if continues and index < limit:
                    chain.append(parent)
            yield parent


def _prompt_chain(token_ids: Sequence[int], extra_keys: ExtraKeys | BlockKeys, block_size: int
                  ) -> tuple[list[int], int]:
    """The known chain of the `Prompt` these tokens start with, and how many full blocks the prompt has; an
    empty chain that may hold none unless it is a prompt of this block size and there are no extra keys."""
    prompt = token_ids.head if isinstance(token_ids, TokenView) else None
    if isinstance(prompt, Prompt) and prompt.block_size == block_size and extra_keys == ():
        return prompt.block_hashes, len(prompt) // block_size
    return [], 0
