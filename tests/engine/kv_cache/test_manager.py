"""KVCacheManager against hand-computed block ids (block_size 4, small pools)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine.kv_cache.manager import KVCacheBlocks, KVCacheManager, hash_block_tokens

BLOCK_SIZE = 4


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def admit(kv: KVCacheManager, request_id: str, token_ids: list[int]) -> KVCacheBlocks | None:
    """What the scheduler does for a waiting request: look up the prefix, allocate the whole prompt."""
    cached, num_cached = kv.get_computed_blocks(token_ids)
    return kv.allocate_slots(request_id, token_ids, num_cached, len(token_ids) - num_cached, cached)


def ref_counts(kv: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in kv.pool.blocks]


def test_first_allocation_takes_lowest_ids() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    assert kv.get_computed_blocks(tokens(0, 10)) == (KVCacheBlocks(()), 0)
    assert kv.allocate_slots("r0", tokens(0, 10), 0, 10) == KVCacheBlocks((0, 1, 2))
    assert kv.block_ids("r0") == [0, 1, 2]
    assert kv.num_free_blocks == 7
    assert kv.usage == pytest.approx(0.3)


def test_second_request_shares_two_block_prefix() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 10))
    prompt = [*tokens(0, 8), 100, 101, 102]
    cached, num_cached = kv.get_computed_blocks(prompt)
    assert (cached, num_cached) == (KVCacheBlocks((0, 1)), 8)
    assert kv.allocate_slots("r1", prompt, num_cached, 3, cached) == KVCacheBlocks((3,))
    assert kv.block_ids("r1") == [0, 1, 3]
    assert ref_counts(kv)[:4] == [2, 2, 1, 1]
    assert kv.num_free_blocks == 6


def test_never_the_whole_prompt() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 8))
    assert kv.get_computed_blocks(tokens(0, 8)) == (KVCacheBlocks((0,)), 4)
    assert kv.get_computed_blocks(tokens(0, 9)) == (KVCacheBlocks((0, 1)), 8)
    assert kv.get_computed_blocks([]) == (KVCacheBlocks(()), 0)


def test_partial_block_is_not_cached() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 6))
    assert kv.pool.blocks[1].block_hash is None
    assert kv.get_computed_blocks([*tokens(0, 6), 50, 51, 52]) == (KVCacheBlocks((0,)), 4)


def test_chained_hash_depends_on_parent() -> None:
    block = tokens(4, 4)
    parent_a, parent_b = hash_block_tokens(None, tokens(0, 4)), hash_block_tokens(None, tokens(100, 4))
    chained = {hash_block_tokens(parent, block) for parent in (None, parent_a, parent_b)}
    assert len(chained) == 3
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", [*tokens(0, 8), 9])
    assert kv.get_computed_blocks([*tokens(100, 4), *tokens(4, 4), 9]) == (KVCacheBlocks(()), 0)


def test_extra_keys_change_the_hash() -> None:
    block = tokens(0, 4)
    assert hash_block_tokens(None, block, ("lora-1",)) != hash_block_tokens(None, block)
    assert hash_block_tokens(None, block, ("lora-1",)) != hash_block_tokens(None, block, ("lora-2",))
    assert hash_block_tokens(None, block, (1,)) != hash_block_tokens(None, block, ("1",))
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    prompt = tokens(0, 9)
    kv.allocate_slots("r0", prompt, 0, 9, extra_keys=("lora-1",))
    assert kv.get_computed_blocks(prompt) == (KVCacheBlocks(()), 0)
    assert kv.get_computed_blocks(prompt, ("lora-2",)) == (KVCacheBlocks(()), 0)
    assert kv.get_computed_blocks(prompt, ("lora-1",)) == (KVCacheBlocks((0, 1)), 8)


def test_hash_is_stable() -> None:
    root = hash_block_tokens(None, [1, 2, 3, 4])
    assert root == 11807619931414002814
    assert hash_block_tokens(root, (5, 6, 7, 8)) == 17960553694313727317
    assert hash_block_tokens(None, [1, 2, 3, 4], ("lora-7", 3)) == 8684802915777282239


def run_python(code: str, hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_hash_matches_across_processes_and_torch_is_never_imported() -> None:
    code = (
        "import sys; from engine.kv_cache.manager import hash_block_tokens as h; "
        "print(h(None, [1, 2, 3, 4], ('x',)), 'torch' in sys.modules)"
    )
    expected = f"{hash_block_tokens(None, [1, 2, 3, 4], ('x',))} False"
    assert {run_python(code, seed) for seed in ("1", "2")} == {expected}


def test_free_puts_tail_block_first_in_line() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 12))
    kv.free("r0")
    assert ref_counts(kv) == [0, 0, 0]
    assert kv.num_free_blocks == 3
    assert kv.allocate_slots("r1", tokens(100, 4), 0, 4) == KVCacheBlocks((2,))
    assert kv.allocate_slots("r2", tokens(200, 4), 0, 4) == KVCacheBlocks((1,))


def test_eviction_removes_the_hash() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    prompt = tokens(0, 12)
    admit(kv, "r0", prompt)
    kv.free("r0")
    assert kv.allocate_slots("r1", tokens(100, 5), 0, 5) == KVCacheBlocks((3, 2))
    assert kv.pool.blocks[2].block_hash is None
    assert kv.get_computed_blocks([*prompt, 12]) == (KVCacheBlocks((0, 1)), 8)


def test_touch_takes_a_free_cached_block_out_of_the_queue() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 9))
    kv.free("r0")
    assert admit(kv, "r1", tokens(0, 13)) == KVCacheBlocks((3, 2))
    assert kv.block_ids("r1") == [0, 1, 3, 2]
    assert ref_counts(kv) == [1, 1, 1, 1]
    assert kv.num_free_blocks == 0
    assert kv.allocate_slots("r2", tokens(100, 1), 0, 1) is None


def test_allocate_is_atomic_when_out_of_blocks() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 9))
    kv.free("r0")
    assert admit(kv, "r1", tokens(0, 20)) is None
    assert kv.num_free_blocks == 4
    assert ref_counts(kv) == [0, 0, 0, 0]
    assert kv.block_ids("r1") == []
    assert kv.get_computed_blocks(tokens(0, 9)) == (KVCacheBlocks((0, 1)), 8)
    assert kv.allocate_slots("r1", tokens(0, 17), 0, 17) is None
    assert kv.num_free_blocks == 4


def test_growing_one_token_at_a_time() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    seq = tokens(0, 3)
    assert kv.allocate_slots("r0", seq, 0, 3) == KVCacheBlocks((0,))
    new_blocks = []
    for token in range(3, 9):
        seq.append(token)
        new_blocks.append(kv.allocate_slots("r0", seq, len(seq) - 1, 1))
    assert [b.block_ids if b is not None else None for b in new_blocks] == [(), (1,), (), (), (), (2,)]
    assert kv.block_ids("r0") == [0, 1, 2]
    assert kv.get_computed_blocks(tokens(0, 9)) == (KVCacheBlocks((0, 1)), 8)


def test_stats_count_queried_and_hit_tokens() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 10))
    admit(kv, "r1", tokens(0, 10))
    assert (kv.stats.queries, kv.stats.hits) == (20, 8)


def test_prefix_caching_disabled() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    assert admit(kv, "r0", tokens(0, 10)) == KVCacheBlocks((0, 1, 2))
    assert admit(kv, "r1", tokens(0, 10)) == KVCacheBlocks((3, 4, 5))
    assert all(block.block_hash is None for block in kv.pool.blocks)
    assert (kv.stats.queries, kv.stats.hits) == (0, 0)


def test_reset_prefix_cache() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 10))
    assert kv.reset_prefix_cache() is False
    assert kv.get_computed_blocks(tokens(0, 10)) == (KVCacheBlocks((0, 1)), 8)
    kv.free("r0")
    assert kv.reset_prefix_cache() is True
    assert kv.get_computed_blocks(tokens(0, 10)) == (KVCacheBlocks(()), 0)
    assert all(block.block_hash is None for block in kv.pool.blocks)


def test_same_prefix_computed_twice_keeps_the_first_block() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    prompt = tokens(0, 9)
    looked_up = [kv.get_computed_blocks(prompt) for _ in range(2)]
    assert looked_up == [(KVCacheBlocks(()), 0)] * 2
    kv.allocate_slots("r0", prompt, 0, 9)
    kv.allocate_slots("r1", prompt, 0, 9)
    assert kv.block_ids("r1") == [3, 4, 5]
    assert kv.get_computed_blocks(prompt) == (KVCacheBlocks((0, 1)), 8)
    kv.free("r0")
    kv.free("r1")
    assert kv.num_free_blocks == 10
    assert admit(kv, "r2", prompt) == KVCacheBlocks((6,))
    assert kv.block_ids("r2") == [0, 1, 6]


def test_free_unknown_request_is_a_noop() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 5))
    kv.free("nope")
    kv.free("r0")
    kv.free("r0")
    assert kv.num_free_blocks == 4
    assert ref_counts(kv) == [0, 0, 0, 0]
    assert kv.block_ids("nope") == []


def test_a_prefix_hit_continues_the_chain_of_hashes() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(kv, "r0", tokens(0, 10))
    prompt = [*tokens(0, 8), *tokens(50, 9)]
    admit(kv, "r1", prompt)
    chain: list[int] = []
    for index in range(len(prompt) // BLOCK_SIZE):
        chain.append(hash_block_tokens(chain[-1] if chain else None, prompt[index * 4:(index + 1) * 4]))
    assert kv.detach("r1").block_hashes == chain
    assert kv.get_computed_blocks([*prompt, 1]) == (KVCacheBlocks((0, 1, 3, 4)), 16)
