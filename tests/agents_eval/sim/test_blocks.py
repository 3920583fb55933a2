"""The simulator's block-hash table gives the engine's own chained hashes."""

from __future__ import annotations

from agents_eval.sim.blocks import BlockHashes, Prompt, SimKVCacheManager
from agents_eval.sim.tokens import TokenView
from engine.kv_cache.manager import KVCacheManager


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


def test_a_prompt_remembers_its_chain_and_hands_it_to_the_next_turn() -> None:
    engine, sim = KVCacheManager(8, 16), SimKVCacheManager(8, 16, True, BlockHashes())
    first = Prompt(16, list(range(1000, 1040)))
    view = TokenView(first, [7, 8, 9])  # a sequence's tokens: prompt, then outputs (the third block spans both)
    assert list(sim._block_hashes(view, (), None, 0, 2)) == list(engine._block_hashes(view, (), None, 0, 2))
    assert first.block_hashes == list(engine._block_hashes(first, (), None, 0, 2))  # only the prompt's blocks
    later = first.then([7, 8, 9], list(range(5000, 5030)))
    assert later.block_hashes == first.block_hashes and later.block_hashes is not first.block_hashes
    for keys, parent, start in (((), None, 0), (("mask", 1), None, 0), ((), 12345, 1)):  # chained, or not
        stop = len(later) // 16
        assert list(sim._block_hashes(TokenView(later, []), keys, parent, start, stop)) == \
            list(engine._block_hashes(later, keys, parent, start, stop))
    assert later.block_hashes == list(engine._block_hashes(later, (), None, 0, 4))
