"""The device pool's blocks: the free ones (an LRU queue, or ordered by an eviction policy when cached) and
the hash -> cached block table. Pure policy, no torch (used by engine.kv_cache.manager.KVCacheManager)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.kv_cache.policy import EvictionPolicy


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set only while this block is the hash table's entry for it


class LowerTiers(Protocol):
    """The tiers below the pool, as the pool sees them (engine.kv_cache.tiers.engine)."""

    def loadable(self, block_hashes: Sequence[int]) -> int: ...  # leading blocks worth loading
    def load(self, block_hash: int, block_id: int) -> bool: ...  # False: missing or corrupt, recompute
    def demote(self, block_hash: int, block_id: int) -> None: ...


class BlockPool:
    """All blocks, the free ones (LRU queue, or policy-ordered when cached), and the hash -> block table."""

    def __init__(self, num_blocks: int, policy: EvictionPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.num_blocks = num_blocks
        # Blocks are made when first taken, in id order: the never-used ones (ids from len(_made)) are the
        # head of the free queue, ahead of every freed block, so they need neither an object nor an entry.
        self._made: list[KVCacheBlock] = []
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict()  # freed blocks, after the never-used
        self.free_cached: dict[int, KVCacheBlock] = {}  # under a policy: free blocks with a hash, by hash
        self.cached: dict[int, KVCacheBlock] = {}
        self.policy, self.clock = policy, clock
        self.on_evict: Callable[[KVCacheBlock], None] | None = None

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """Every block by id; makes the never-used ones (a whole pool of objects: not for the hot path)."""
        if len(self._made) < self.num_blocks:
            unused = [KVCacheBlock(block_id) for block_id in range(len(self._made), self.num_blocks)]
            self._made += unused
            self.free_queue = OrderedDict([*((b.block_id, b) for b in unused), *self.free_queue.items()])
        return self._made

    def block(self, block_id: int) -> KVCacheBlock:
        return (self._made if block_id < len(self._made) else self.blocks)[block_id]

    @property
    def num_free(self) -> int:
        return self.num_blocks - len(self._made) + len(self.free_queue) + len(self.free_cached)

    def lookup(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def take(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop the least recently freed blocks, evicting their hashes; each gets one reference."""
        if num_blocks > self.num_free:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free} free")
        return [self._pop_free() for _ in range(num_blocks)]

    def _pop_free(self) -> KVCacheBlock:
        if len(self._made) < self.num_blocks:
            block = KVCacheBlock(len(self._made), ref_cnt=1)
            self._made.append(block)
            return block
        if self.policy is None or self.free_queue:
            _, block = self.free_queue.popitem(last=False)
        else:
            victim = self.policy.victim()
            if victim is None:  # only VIP blocks are free: demote one rather than fail the allocation
                victim = next(iter(self.free_cached))
            block = self.free_cached.pop(victim)  # type: ignore[call-overload]
        if block.block_hash is not None:
            if self.on_evict is not None:
                self.on_evict(block)
            self._forget(block)
        block.ref_cnt = 1
        return block

    def _forget(self, block: KVCacheBlock) -> None:
        assert block.block_hash is not None
        del self.cached[block.block_hash]
        if self.policy is not None:
            self.policy.remove(block.block_hash)
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add a reference; a free cached block stops being free instead of being evicted."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._unfree(block)
            block.ref_cnt += 1

    def _unfree(self, block: KVCacheBlock) -> None:
        if self.policy is not None and block.block_hash is not None:
            del self.free_cached[block.block_hash]
            self.policy.candidate(block.block_hash, False)
        else:
            del self.free_queue[block.block_id]

    def release(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a reference; blocks reaching zero become free (LRU: at the queue's tail, in the order given)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            if self.policy is not None and block.block_hash is not None:
                self.free_cached[block.block_hash] = block
                self.policy.candidate(block.block_hash, True)
            else:
                self.free_queue[block.block_id] = block

    def cache(self, block: KVCacheBlock, block_hash: int, parent: int | None = None) -> None:
        """Register a full block; the first block registered under a hash keeps the entry."""
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block
            if self.policy is not None:
                self.policy.access(block_hash, parent, self.clock())

    def accessed(self, blocks: Sequence[KVCacheBlock], vip: bool = False) -> None:
        """A prefix of cached blocks was reused (or pinned for a VIP session): the policy scores it."""
        if self.policy is not None:
            keys = [block.block_hash for block in blocks if block.block_hash is not None]
            self.policy.access_chain(keys, self.clock(), vip)

    def reset(self) -> bool:
        if self.num_free < self.num_blocks:
            return False
        for block in list(self.cached.values()):
            self._forget(block)
        self.free_queue.update((block.block_id, block) for block in self.free_cached.values())
        self.free_cached.clear()
        return True
