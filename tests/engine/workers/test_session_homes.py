"""Session homes: which worker holds a session's KV, for how much of the next prompt, beyond the pin's TTL."""

from __future__ import annotations

import gc

import pytest

from engine.workers.coordinator.session_homes import SessionHomes


def test_the_home_holds_the_common_prefix_in_whole_blocks() -> None:
    homes = SessionHomes(block_size=4)
    homes.turn_finished("s", 2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], ttl_s=1.0, now=0.0)
    assert homes.cached_tokens("s", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]) == {2: 8}
    assert homes.cached_tokens("s", [9, 9]) == {2: 0}
    assert homes.cached_tokens("other", [1, 2]) == {} and homes.cached_tokens(None, [1]) == {}


def test_a_home_outlives_its_pin_and_follows_the_last_turn() -> None:
    homes = SessionHomes(block_size=2)
    homes.turn_finished("s", 0, [1, 2, 3, 4], ttl_s=0.5, now=0.0)
    assert homes.cached_tokens("s", [1, 2, 3, 4, 5]) == {0: 4}  # pin long gone: the prefix cache likely has it
    assert homes.set_ttl("s", 3.0, now=10.0) == 0 and homes.homes["s"].pinned_until == 13.0
    homes.turn_finished("s", 1, [1, 2, 3, 4, 5, 6], ttl_s=1.0, now=11.0)
    assert homes.cached_tokens("s", [1, 2, 3, 4, 5, 6, 7]) == {1: 6}
    assert homes.set_ttl("unknown", 1.0, now=0.0) is None


def test_the_oldest_homes_go_first_and_a_dead_worker_takes_its_homes() -> None:
    homes = SessionHomes(block_size=1, max_homes=2)
    for key, worker in (("a", 0), ("b", 1), ("c", 0)):
        homes.turn_finished(key, worker, [1], ttl_s=1.0, now=0.0)
    assert list(homes.homes) == ["b", "c"]
    homes.forget_worker(0)
    assert list(homes.homes) == ["b"] and len(homes) == 1


HISTORY = list(range(1000, 1700))


@pytest.mark.parametrize("differs_at", [0, 1, 63, 64, 65, 127, 128, 500, 699])
def test_the_common_prefix_ends_at_the_first_different_token(differs_at: int) -> None:
    homes = SessionHomes(block_size=1)
    homes.turn_finished("s", 0, HISTORY, ttl_s=1.0, now=0.0)
    prompt = [*HISTORY[:differs_at], -1, *HISTORY[differs_at + 1:], 5, 6]
    assert homes.cached_tokens("s", prompt) == {0: differs_at}


@pytest.mark.parametrize(("prompt", "common"), [([*HISTORY, 1, 2], 700), (HISTORY[:300], 300), ([], 0),
                                                 (HISTORY[:64] + [7] * 10, 64)])
def test_a_prompt_longer_or_shorter_than_the_home(prompt: list[int], common: int) -> None:
    homes = SessionHomes(block_size=1)
    homes.turn_finished("s", 0, HISTORY, ttl_s=1.0, now=0.0)
    assert homes.cached_tokens("s", prompt) == {0: common}


def test_the_cyclic_collector_does_not_walk_a_homes_tokens_one_by_one() -> None:
    homes = SessionHomes(block_size=1)
    homes.turn_finished("s", 0, HISTORY, ttl_s=1.0, now=0.0)
    held = homes.homes["s"].token_ids
    assert list(held) == HISTORY and len(gc.get_referents(held)) <= 1  # a list's are its 700 ints
