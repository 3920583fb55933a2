"""The simulator's block-hash table gives the engine's own chained hashes."""

from __future__ import annotations

from agents_eval.sim.blocks import BlockHashes, SimKVCacheManager
from engine.block_manager import KVCacheManager


def _hashes(kv: KVCacheManager, tokens: list[int], keys: object = ()) -> list[int]:
    return list(kv._block_hashes(tokens, keys, None, 0, len(tokens) // kv.block_size))  # type: ignore[arg-type]


def test_same_hashes_as_the_engine_with_and_without_extra_keys() -> None:
    tokens = list(range(1000, 1100))
    engine, table = KVCacheManager(8, 16), BlockHashes(capacity=3)
    sim = SimKVCacheManager(8, 16, True, table)
    for keys in ((), ("mask", 4), lambda index: (index,)):
        assert _hashes(sim, tokens, keys) == _hashes(engine, tokens, keys)
        assert _hashes(sim, tokens, keys) == _hashes(engine, tokens, keys)  # now from the table (and its refills)
    changed = [*tokens[:48], 7, *tokens[49:]]
    assert _hashes(sim, changed) == _hashes(engine, changed)


def test_prefix_cache_finds_what_the_engine_finds() -> None:
    tokens = list(range(500, 600))
    sim = SimKVCacheManager(16, 16, True, BlockHashes())
    assert sim.allocate_slots("a", tokens, 0, len(tokens)) is not None
    assert sim.get_computed_blocks(tokens)[1] == 96
