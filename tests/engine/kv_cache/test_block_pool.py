"""The device pool under the LFU policy: uncached blocks go first, then leaves by score; VIP blocks only
when nothing else is free; an evicted cached block is handed to on_evict before its hash is forgotten."""

from __future__ import annotations

from engine.kv_cache.block_pool import BlockPool, KVCacheBlock
from engine.kv_cache.policy import LfuPolicy, LfuWeights


def cached_chain(pool: BlockPool, hashes: list[int], vip: bool = False) -> list[KVCacheBlock]:
    blocks = pool.take(len(hashes))
    for parent, (block, block_hash) in zip([None, *hashes[:-1]], zip(blocks, hashes, strict=True), strict=True):
        pool.cache(block, block_hash, parent)
    if vip:
        pool.accessed(blocks, vip=True)
    pool.release(reversed(blocks))
    return blocks


def test_uncached_then_leaves_then_vip() -> None:
    pool = BlockPool(6, LfuPolicy(LfuWeights(decay_s=1e6)), clock=lambda: 0.0)
    evicted: list[int] = []
    pool.on_evict = lambda block: evicted.append(block.block_hash)  # type: ignore[arg-type]
    cached_chain(pool, [10, 11, 12], vip=True)
    cached_chain(pool, [20, 21])
    assert pool.num_free == 6
    first = pool.take(1)[0]
    assert first.block_hash is None and evicted == []  # the one uncached block goes first
    pool.take(2)
    assert evicted == [21, 20]  # the plain chain, its leaf first
    pool.take(3)
    assert sorted(evicted[2:]) == [10, 11, 12]  # then VIP blocks, rather than fail the allocation
    assert pool.cached == {} and pool.num_free == 0


def test_a_touched_block_is_not_evicted_and_reset_forgets_hashes() -> None:
    pool = BlockPool(3, LfuPolicy(), clock=lambda: 0.0)
    blocks = cached_chain(pool, [1, 2, 3])
    pool.touch([blocks[2]])
    assert pool.num_free == 2
    pool.release([blocks[2]])
    assert pool.reset() and pool.cached == {} and all(b.block_hash is None for b in pool.blocks)
    assert pool.num_free == 3 and len(pool.take(3)) == 3


def test_never_used_blocks_go_first_in_id_order_listed_or_not() -> None:
    for list_blocks in (False, True):
        pool = BlockPool(5)
        first = pool.take(2)
        pool.release(reversed(first))
        if list_blocks:
            assert [b.ref_cnt for b in pool.blocks] == [0] * 5
        assert pool.num_free == 5
        assert [b.block_id for b in pool.take(5)] == [2, 3, 4, 1, 0]
