"""Paged KV cache accounting: a block pool with chained-hash prefix caching. Pure policy, no torch.

A full block is identified by the hash of its tokens chained to its parent block's hash, so equal hashes
mean equal prefixes. Blocks no request holds sit in an LRU free queue; a cached one there keeps its hash
and can be reused ("touched") until it is popped for another allocation, which evicts its hash.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

ExtraKeys = tuple[int | str, ...]
BlockKeys = Callable[[int], ExtraKeys]  # block index -> the extra keys of that block


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int], extra_keys: ExtraKeys = ()) -> int:
    """Chained hash of one full block: a stable 64-bit int, identical across processes and runs."""
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(b"\x00" if parent_hash is None else b"\x01" + parent_hash.to_bytes(8, "big"))
    hasher.update(struct.pack(f">I{len(token_ids)}q", len(token_ids), *token_ids))
    for key in extra_keys:
        hasher.update(_encode_extra_key(key))
    return int.from_bytes(hasher.digest(), "big")


def _encode_extra_key(key: int | str) -> bytes:
    tag, text = (b"s", key) if isinstance(key, str) else (b"i", str(int(key)))
    data = text.encode()
    return tag + struct.pack(">I", len(data)) + data


def _cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass(frozen=True)
class KVCacheBlocks:
    """Opaque allocation result handed to the scheduler."""

    block_ids: tuple[int, ...] = ()


@dataclass
class PrefixCacheStats:
    """Prefix cache counters; a hit rate is hits / queries, computed by whoever reads them."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens found cached


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set only while this block is the hash table's entry for it


@dataclass
class HeldBlocks:
    """Blocks (one reference each) and their chained hashes, held by something other than a request."""

    blocks: list[KVCacheBlock] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)


class BlockPool:
    """All blocks, the LRU queue of those no request holds, and the hash -> cached block table."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[int, KVCacheBlock] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def lookup(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def take(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop the least recently freed blocks, evicting their hashes; each gets one reference."""
        if num_blocks > self.num_free:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free} free")
        return [self._pop_free() for _ in range(num_blocks)]

    def _pop_free(self) -> KVCacheBlock:
        _, block = self.free_queue.popitem(last=False)
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None
        block.ref_cnt = 1
        return block

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add a reference; a free cached block leaves the free queue instead of being evicted."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def release(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a reference; blocks reaching zero join the queue's tail in the order given."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def cache(self, block: KVCacheBlock, block_hash: int) -> None:
        """Register a full block; the first block registered under a hash keeps the entry."""
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def reset(self) -> bool:
        if self.num_free < len(self.blocks):
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        return True


class KVCacheManager:
    """Per-request block lists on top of a BlockPool; the scheduler's only view of the KV cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.stats = PrefixCacheStats()
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_block_hashes: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free / len(self.pool.blocks)

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_blocks.get(request_id, [])]

    def get_computed_blocks(
        self, token_ids: Sequence[int], extra_keys: ExtraKeys | BlockKeys = ()
    ) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix of full blocks, always leaving at least one token to compute."""
        if not self.enable_prefix_caching:
            return KVCacheBlocks(), 0
        max_blocks = (len(token_ids) - 1) // self.block_size
        blocks = self._cached_prefix(self._block_hashes(token_ids, extra_keys, None, 0, max_blocks))
        num_computed_tokens = len(blocks) * self.block_size
        self.stats.queries += len(token_ids)
        self.stats.hits += num_computed_tokens
        return KVCacheBlocks(tuple(block.block_id for block in blocks)), num_computed_tokens

    def _cached_prefix(self, block_hashes: Iterable[int]) -> list[KVCacheBlock]:
        blocks = []
        for block_hash in block_hashes:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _block_hashes(
        self, token_ids: Sequence[int], extra_keys: ExtraKeys | BlockKeys, parent: int | None, start: int, stop: int
    ) -> Iterator[int]:
        """Chained hashes of full blocks start..stop-1, lazily, so a lookup stops at its first miss."""
        size = self.block_size
        for index in range(start, stop):
            keys = extra_keys(index) if callable(extra_keys) else extra_keys
            parent = hash_block_tokens(parent, token_ids[index * size : (index + 1) * size], keys)
            yield parent

    def allocate_slots(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
        extra_keys: ExtraKeys | BlockKeys = (),
    ) -> KVCacheBlocks | None:
        """Give the request blocks for its first num_computed + num_new tokens; None (and no change) if full.

        Returns only the newly allocated blocks. Blocks that become full are registered in the prefix cache.
        """
        computed = [self.pool.blocks[block_id] for block_id in self._ids(new_computed_blocks)]
        num_held = len(self.req_blocks.get(request_id, []))
        if computed and num_held:
            raise ValueError(f"request {request_id}: new_computed_blocks only at its first allocation")
        num_tokens = num_computed_tokens + num_new_tokens
        num_needed = max(0, _cdiv(num_tokens, self.block_size) - num_held - len(computed))
        num_revived = sum(1 for block in computed if block.ref_cnt == 0)
        if num_needed > self.pool.num_free - num_revived:
            return None
        self.pool.touch(computed)
        new_blocks = self.pool.take(num_needed)
        self.req_blocks.setdefault(request_id, []).extend(computed + new_blocks)
        self._cache_full_blocks(request_id, token_ids, min(num_tokens, len(token_ids)), extra_keys)
        return KVCacheBlocks(tuple(block.block_id for block in new_blocks))

    @staticmethod
    def _ids(blocks: KVCacheBlocks | None) -> tuple[int, ...]:
        return blocks.block_ids if blocks is not None else ()

    def _cache_full_blocks(
        self, request_id: str, token_ids: Sequence[int], num_tokens: int, extra_keys: ExtraKeys | BlockKeys
    ) -> None:
        if not self.enable_prefix_caching:
            return
        hashes = self.req_block_hashes.setdefault(request_id, [])
        start, stop = len(hashes), num_tokens // self.block_size
        hashes.extend(self._block_hashes(token_ids, extra_keys, hashes[-1] if hashes else None, start, stop))
        for block, block_hash in zip(self.req_blocks[request_id][start:stop], hashes[start:], strict=True):
            self.pool.cache(block, block_hash)

    def free(self, request_id: str) -> None:
        """Drop the request's references, tail block first so prefixes outlive tails in the cache."""
        self.release(self.detach(request_id))

    def detach(self, request_id: str) -> HeldBlocks:
        """Take the request's blocks and hashes away from it, references and all (e.g. to pin them)."""
        return HeldBlocks(self.req_blocks.pop(request_id, []), self.req_block_hashes.pop(request_id, []))

    def attach(self, request_id: str, held: HeldBlocks) -> None:
        """A request without blocks takes over held blocks, references and all."""
        if self.req_blocks.get(request_id):
            raise ValueError(f"request {request_id} already holds blocks")
        self.req_blocks[request_id] = held.blocks
        self.req_block_hashes[request_id] = held.block_hashes

    def release(self, held: HeldBlocks) -> None:
        self.pool.release(reversed(held.blocks))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, only when no request holds a block; returns whether it did."""
        return self.pool.reset()
