"""The engine's `KVCacheManager` with its chained block hashes remembered across the cluster.

A simulated turn's history is hashed over and over: looked up on the worker it lands on, hashed again as its
blocks fill, again on the decode worker its KV is handed to, and again at the session's next turn. The hash
is a pure function of (parent hash, block tokens, extra keys), so `SimKVCacheManager` looks it up in a table
the cluster's workers share and calls the engine's own `hash_block_tokens` only on a miss. It overrides
nothing else: allocation, prefix lookup, eviction and pins are the engine's code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from engine.block_manager import BlockKeys, ExtraKeys, KVCacheManager, hash_block_tokens


class BlockHashes:
    """Chain hashes already computed; emptied when it reaches `capacity` entries, to bound its memory (the
    repeats come within a turn or at the session's next one, minutes apart at most)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._known: dict[tuple[int | None, tuple[int, ...], ExtraKeys], int] = {}

    def hash(self, parent: int | None, token_ids: Sequence[int], extra_keys: ExtraKeys) -> int:
        key = (parent, tuple(token_ids), extra_keys)
        known = self._known.get(key)
        if known is None:
            if len(self._known) >= self.capacity:
                self._known.clear()
            known = self._known[key] = hash_block_tokens(parent, token_ids, extra_keys)
        return known


class SimKVCacheManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, hashes: BlockHashes) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.hashes = hashes

    def _block_hashes(self, token_ids: Sequence[int], extra_keys: ExtraKeys | BlockKeys, parent: int | None,
                      start: int, stop: int) -> Iterator[int]:
        size = self.block_size
        for index in range(start, stop):
            keys = extra_keys(index) if callable(extra_keys) else extra_keys
            parent = self.hashes.hash(parent, token_ids[index * size:(index + 1) * size], keys)
            yield parent
