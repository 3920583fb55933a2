"""Paged KV cache accounting: per-request blocks over the pool of engine/kv_cache/block_pool.py, with
chained-hash prefix caching. Pure policy, no torch.

A full block is identified by the hash of its tokens chained to its parent block's hash, so equal hashes
mean equal prefixes. Blocks no request holds are free; a cached one keeps its hash and can be reused
("touched") until it is taken for another allocation, which evicts its hash. Without an eviction policy the
free blocks form one LRU queue; with one (engine.kv_cache.policy), blocks without a hash go first, then the
policy's victim. An evicted block is handed to `on_evict` first (demotion to a lower tier), and a prefix
that misses the pool is looked up in the lower tiers (`LowerTiers`) and loaded where that is worth it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from engine.kv_cache.block_pool import BlockPool, KVCacheBlock, LowerTiers
from engine.kv_cache.policy import EvictionPolicy

ExtraKeys = tuple[int | str, ...]
BlockKeys = Callable[[int], ExtraKeys]  # block index -> the extra keys of that block


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int], extra_keys: ExtraKeys = ()) -> int:
    """Chained hash of one full block: a stable 64-bit int, identical across processes and runs."""
    hasher = hashlib.blake2b(b"\x00" if parent_hash is None else b"\x01" + parent_hash.to_bytes(8, "big"),
                             digest_size=8)
    hasher.update(_block_struct(len(token_ids)).pack(len(token_ids), *token_ids))
    for key in extra_keys:
        hasher.update(_encode_extra_key(key))
    return int.from_bytes(hasher.digest(), "big")


@functools.cache
def _block_struct(num_tokens: int) -> struct.Struct:
    return struct.Struct(f">I{num_tokens}q")


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


_NO_BLOCKS = KVCacheBlocks()


@dataclass
class PrefixCacheStats:
    """Prefix cache counters; a hit rate is hits / queries, computed by whoever reads them."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens found cached


@dataclass
class HeldBlocks:
    """Blocks (one reference each) and their chained hashes, held by something other than a request."""

    blocks: list[KVCacheBlock] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)


class KVCacheManager:
    """Per-request block lists on top of a BlockPool; the scheduler's only view of the KV cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 policy: EvictionPolicy | None = None, tiers: LowerTiers | None = None) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, policy)
        self.tiers: LowerTiers | None = None
        if tiers is not None:
            self.set_tiers(tiers)
        self.stats = PrefixCacheStats()
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_block_hashes: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_blocks.get(request_id, [])]

    def get_computed_blocks(
        self, token_ids: Sequence[int], extra_keys: ExtraKeys | BlockKeys = ()
    ) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix of full blocks, always leaving at least one token to compute."""
        if not self.enable_prefix_caching:
            return KVCacheBlocks(), 0
        max_blocks = (len(token_ids) - 1) // self.block_size
        hashes = self._block_hashes(token_ids, extra_keys, None, 0, max_blocks)
        blocks, first_miss = self._cached_prefix(hashes)
        self.pool.accessed(blocks)
        if self.tiers is not None and first_miss is not None:
            blocks += self._load_from_tiers(blocks, [first_miss, *hashes])
        num_computed_tokens = len(blocks) * self.block_size
        self.stats.queries += len(token_ids)
        self.stats.hits += num_computed_tokens
        return KVCacheBlocks(tuple(block.block_id for block in blocks)), num_computed_tokens

    def set_tiers(self, tiers: LowerTiers) -> None:
        """Demote evicted blocks into lower tiers and look prefix misses up there."""
        self.tiers = tiers
        self.pool.on_evict = lambda block: tiers.demote(block.block_hash, block.block_id)  # type: ignore[arg-type]

    def promote(self, block_hashes: Sequence[int]) -> int:
        """Bring the chain's blocks that only lower tiers hold back into the pool, as free cached blocks
        (a prefetch); returns how many were loaded."""
        if self.tiers is None:
            return 0
        hashes = iter(block_hashes)
        blocks, first_miss = self._cached_prefix(hashes)
        return 0 if first_miss is None else len(self._load_from_tiers(blocks, [first_miss, *hashes]))

    def _cached_prefix(self, block_hashes: Iterator[int]) -> tuple[list[KVCacheBlock], int | None]:
        """Leading blocks found in the pool, and the hash of the first one missing (None: no miss); the
        iterator is left just past that miss."""
        blocks: list[KVCacheBlock] = []
        for block_hash in block_hashes:
            block = self.pool.lookup(block_hash)
            if block is None:
                return blocks, block_hash
            blocks.append(block)
        return blocks, None

    def _load_from_tiers(self, prefix: list[KVCacheBlock], chain: list[int]) -> list[KVCacheBlock]:
        """Load the leading blocks of the missed chain that a lower tier holds and that are cheaper to load
        than to recompute; the prefix is held meanwhile, so making room never evicts it."""
        assert self.tiers is not None
        count = self.tiers.loadable(chain)
        if count == 0:
            return []
        self.pool.touch(prefix)
        loaded: list[KVCacheBlock] = []
        parent = prefix[-1].block_hash if prefix else None
        for block_hash in itertools.islice(chain, min(count, self.pool.num_free)):
            block = self.pool.take(1)[0]
            if not self.tiers.load(block_hash, block.block_id):
                self.pool.release([block])
                break
            self.pool.cache(block, block_hash, parent)
            loaded.append(block)
            parent = block_hash
        self.pool.release(reversed(prefix + loaded))
        return loaded

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
        computed = [self.pool.block(block_id) for block_id in self._ids(new_computed_blocks)]
        num_held = len(self.req_blocks.get(request_id, ()))
        if computed and num_held:
            raise ValueError(f"request {request_id}: new_computed_blocks only at its first allocation")
        num_tokens = num_computed_tokens + num_new_tokens
        num_needed = max(0, _cdiv(num_tokens, self.block_size) - num_held - len(computed))
        if computed:
            if num_needed > self.pool.num_free - sum(1 for block in computed if block.ref_cnt == 0):
                return None
            self.pool.touch(computed)
        elif num_needed > self.pool.num_free:
            return None
        new_blocks = self.pool.take(num_needed) if num_needed else []
        self.req_blocks.setdefault(request_id, []).extend(computed + new_blocks)
        self._cache_full_blocks(request_id, token_ids, min(num_tokens, len(token_ids)), extra_keys, computed)
        return KVCacheBlocks(tuple(block.block_id for block in new_blocks)) if new_blocks else _NO_BLOCKS

    @staticmethod
    def _ids(blocks: KVCacheBlocks | None) -> tuple[int, ...]:
        return blocks.block_ids if blocks is not None else ()

    def _cache_full_blocks(self, request_id: str, token_ids: Sequence[int], num_tokens: int,
                           extra_keys: ExtraKeys | BlockKeys, computed: list[KVCacheBlock]) -> None:
        """Register the request's blocks that became full. Its prefix-cache hits (`computed`) are registered
        under their chain hashes already, so those are taken as the chain's start instead of rehashed."""
        if not self.enable_prefix_caching:
            return
        hashes = self.req_block_hashes.setdefault(request_id, [])
        stop = num_tokens // self.block_size
        if not hashes:
            hashes += [block.block_hash for block in computed[:stop]]  # type: ignore[misc]
        start = len(hashes)
        if start >= stop:
            return
        hashes.extend(self._block_hashes(token_ids, extra_keys, hashes[-1] if hashes else None, start, stop))
        parents = [hashes[index - 1] if index else None for index in range(start, stop)]
        for block, block_hash, parent in zip(self.req_blocks[request_id][start:stop], hashes[start:], parents,
                                             strict=True):
            self.pool.cache(block, block_hash, parent)

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
