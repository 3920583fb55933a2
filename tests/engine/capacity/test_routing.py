from __future__ import annotations

import pytest

from engine.capacity.routing import Turn, choose_decode_worker, place, prefill_locally, worker_load
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import DECODE, PREFILL, WorkerLoad

BLOCK = 16
SETTINGS = CapacitySettings()


def decoder(worker_id: int, running: int = 0, waiting: int = 0) -> WorkerLoad:
    return WorkerLoad(worker_id, DECODE, running=running, waiting_prefill_tokens=waiting, decode_streams=running)


def prefiller(worker_id: int, running: int = 0, waiting: int = 0) -> WorkerLoad:
    return WorkerLoad(worker_id, PREFILL, running=running, waiting_prefill_tokens=waiting)


SESSION_TURN = Turn(1024, "session-a", {1: 960})  # worker 1 holds all but 4 blocks; others would move 64


@pytest.mark.parametrize("holder_load, chosen", [(0, 1), (10, 1), (59, 1), (61, 2), (100, 2)])
def test_a_loaded_kv_holder_loses_only_when_the_load_outweighs_the_blocks(holder_load: int, chosen: int) -> None:
    choice = choose_decode_worker(SESSION_TURN, [decoder(1, holder_load), decoder(2)], SETTINGS, BLOCK)
    assert choice.worker_id == chosen
    assert choice.blocks_to_move == (4 if chosen == 1 else 64)
    assert choice.cost == (4 + holder_load if chosen == 1 else 64)


def test_equal_costs_go_to_the_lowest_id_and_queued_tokens_count_as_load() -> None:
    assert choose_decode_worker(SESSION_TURN, [decoder(2), decoder(1, 60)], SETTINGS, BLOCK).worker_id == 1
    queued = decoder(1, 50, waiting=320)  # 50 requests + 20 blocks of queued prompt
    assert worker_load(queued, BLOCK) == 70
    assert choose_decode_worker(SESSION_TURN, [queued, decoder(2)], SETTINGS, BLOCK).worker_id == 2


def test_overlap_weight_scales_the_blocks() -> None:
    load_only = CapacitySettings(overlap_weight=0.0)
    assert choose_decode_worker(SESSION_TURN, [decoder(1, 1), decoder(2)], load_only, BLOCK).worker_id == 2
    heavy = CapacitySettings(overlap_weight=2.0)
    assert choose_decode_worker(SESSION_TURN, [decoder(1, 100), decoder(2)], heavy, BLOCK).worker_id == 1


@pytest.mark.parametrize("uncached, prompt, local", [
    (255, 300, True),     # under local_prefill_max_tokens
    (256, 300, False),    # at it, and most of the prompt
    (256, 4096, True),    # 6% of the prompt is uncached
    (300, 3000, False),   # exactly 10%: not below the share
    (299, 3000, True),
    (0, 0, True),
])
def test_prefill_locally_follows_dynamos_rule(uncached: int, prompt: int, local: bool) -> None:
    assert prefill_locally(uncached, prompt, SETTINGS) is local


def test_place_a_small_delta_on_the_decode_worker() -> None:
    workers = [prefiller(0), decoder(1, 3), decoder(2)]
    placement = place(SESSION_TURN, workers, SETTINGS, BLOCK)
    assert (placement.decode_worker, placement.prefill_worker, placement.local) == (1, None, True)
    assert placement.reason.startswith("local: 64 uncached of 1024 tokens")


def test_place_a_large_delta_on_the_least_loaded_prefill_worker() -> None:
    workers = [prefiller(0, 2), prefiller(3, 1, waiting=64), prefiller(4, 1), decoder(1, 3), decoder(2)]
    placement = place(Turn(2048), workers, SETTINGS, BLOCK)
    assert (placement.decode_worker, placement.prefill_worker, placement.local) == (2, 4, False)
    assert placement.reason.startswith("remote: 2048 uncached")


def test_an_idle_deployment_prefills_even_a_large_delta_locally_unless_it_is_distserve() -> None:
    idle_workers = [prefiller(0), decoder(1), decoder(2)]
    placement = place(Turn(2048), idle_workers, SETTINGS, BLOCK)
    assert (placement.decode_worker, placement.prefill_worker, placement.local) == (1, None, True)
    assert placement.reason.startswith("local: nothing running; 2048 uncached")
    for busy in ([prefiller(0, 1), decoder(1), decoder(2)], [prefiller(0, waiting=32), decoder(1, 1), decoder(2, 1)]):
        assert place(Turn(2048), busy, SETTINGS, BLOCK).prefill_worker == 0
    distserve = CapacitySettings(local_prefill_max_tokens=0, local_prefill_max_uncached_share=0)
    assert place(Turn(2048), idle_workers, distserve, BLOCK).prefill_worker == 0


def test_place_without_a_prefill_or_a_decode_worker() -> None:
    assert place(Turn(2048), [decoder(1), decoder(2)], SETTINGS, BLOCK).local
    only_prefill = place(Turn(2048, None, {5: 2048}), [prefiller(4), prefiller(5, 2)], SETTINGS, BLOCK)
    assert (only_prefill.decode_worker, only_prefill.local) == (5, True)
    with pytest.raises(ValueError, match="no worker"):
        place(Turn(10), [], SETTINGS, BLOCK)


def holder(streams: int, rate: float | None) -> WorkerLoad:
    return WorkerLoad(1, DECODE, running=streams, decode_streams=streams, prefill_tokens_per_s=rate)


SHARED_TURN = Turn(1024, "session-a", {1: 960, 0: 960})  # the prefill worker holds the history too


def test_a_small_delta_goes_remote_when_prefilling_it_would_stall_the_decoding_streams() -> None:
    """64 uncached tokens are small by Dynamo's rule; at 400 tokens/s they hold the decode worker 160 ms, past
    the 50 ms bound, while it has a stream decoding. Idle, or fast enough, it stays local; 0 lifts the bound."""
    slow = place(SHARED_TURN, [prefiller(0, 1), holder(1, 400.0)], SETTINGS, BLOCK)
    assert (slow.decode_worker, slow.prefill_worker, slow.local) == (1, 0, False)
    assert "too slow to prefill beside worker 1's 1 streams (holds them 160 ms)" in slow.reason
    for streams, rate in ((0, 400.0), (1, 2000.0), (1, None)):
        assert place(SHARED_TURN, [prefiller(0, 1), holder(streams, rate)], SETTINGS, BLOCK).local
    unbounded = CapacitySettings(local_prefill_max_stall_s=0)
    assert place(SHARED_TURN, [prefiller(0, 1), holder(1, 400.0)], unbounded, BLOCK).local


def test_the_stall_is_judged_by_what_prompt_tokens_add_to_the_decoding_steps() -> None:
    """The decode worker's steps average 400 prompt tokens/s, but most of each step is its streams' own: the
    prompt tokens add a second per 2,000. 64 tokens then hold the streams 32 ms, inside the 50 ms bound."""
    mixed = WorkerLoad(1, DECODE, running=1, decode_streams=1, prefill_tokens_per_s=400.0,
                       prefill_stall_tokens_per_s=2000.0)
    assert mixed.stall_tokens_per_s == 2000.0 and holder(1, 400.0).stall_tokens_per_s == 400.0
    assert place(SHARED_TURN, [prefiller(0, 1), mixed], SETTINGS, BLOCK).local
    assert not place(SHARED_TURN, [prefiller(0, 1), holder(1, 400.0)], SETTINGS, BLOCK).local


@pytest.mark.parametrize("streams, remote", [(1, False), (15, False), (17, True)])
def test_a_stalling_delta_stays_local_when_the_prefill_worker_would_recompute_the_history(streams: int,
                                                                                           remote: bool) -> None:
    """The prefill worker lacks all 1,024 tokens: 2.56 s there at 400 tokens/s, against a 160 ms stall per
    decoding stream here; remote only once more than 16 streams would wait it out."""
    placement = place(SESSION_TURN, [prefiller(0, 1), holder(streams, 400.0)], SETTINGS, BLOCK)
    assert placement.local is not remote
    if not remote:
        assert placement.reason.endswith("would compute 1024, longer than the stall it spares")
    faster = WorkerLoad(0, PREFILL, running=1, prefill_tokens_per_s=8000.0)  # 128 ms for the whole prompt
    assert not place(SESSION_TURN, [faster, holder(1, 400.0)], SETTINGS, BLOCK).local


def test_a_large_delta_is_prefilled_where_it_decodes_when_the_prefill_queue_is_long() -> None:
    """Dynamo's max_prefill_queue_size in seconds: 6,000 queued tokens at 10,000 tokens/s are 0.6 s, past the
    0.5 s bound, so a 2,048-token turn is prefilled on its decode worker, whose own queue is shorter; under the
    bound, with the decode worker's queue longer, with no measured rate, or in DistServe's mode, it goes remote."""
    def queued(worker_id: int, role: str, tokens: int, rate: float | None = 10000.0) -> WorkerLoad:
        return WorkerLoad(worker_id, role, running=1, waiting_prefill_tokens=tokens, prefill_tokens_per_s=rate)

    full = place(Turn(2048), [queued(0, PREFILL, 6000), queued(1, DECODE, 0)], SETTINGS, BLOCK)
    assert (full.prefill_worker, full.local) == (None, True)
    assert full.reason.endswith("prefill worker 0's queue holds 0.60 s")
    for workers in ([queued(0, PREFILL, 4000), queued(1, DECODE, 0)],
                    [queued(0, PREFILL, 6000), queued(1, DECODE, 7000)],
                    [queued(0, PREFILL, 6000, rate=None), queued(1, DECODE, 0)]):
        assert place(Turn(2048), workers, SETTINGS, BLOCK).prefill_worker == 0
    distserve = CapacitySettings(local_prefill_max_tokens=0, local_prefill_max_uncached_share=0)
    assert place(Turn(2048), [queued(0, PREFILL, 6000), queued(1, DECODE, 0)], distserve, BLOCK).prefill_worker == 0
    unbounded = CapacitySettings(remote_prefill_max_queue_s=0)
    assert place(Turn(2048), [queued(0, PREFILL, 6000), queued(1, DECODE, 0)], unbounded, BLOCK).prefill_worker == 0


def test_a_placement_says_whether_the_turn_is_the_prefill_workers_work() -> None:
    """A prefill worker's work is a turn one computes, or would where the deployment has none; a small delta, or
    a large one an idle deployment keeps where it decodes, is the decode worker's own."""
    small = place(SESSION_TURN, [prefiller(0), decoder(1, 3), decoder(2)], SETTINGS, BLOCK)
    assert (small.for_prefill_worker, small.uncached_tokens) == (False, 64)
    remote = place(Turn(2048), [prefiller(0, 1), decoder(1, 1), decoder(2, 1)], SETTINGS, BLOCK)
    assert (remote.prefill_worker, remote.for_prefill_worker, remote.uncached_tokens) == (0, True, 2048)
    none = place(Turn(2048), [decoder(1, 1), decoder(2, 1)], SETTINGS, BLOCK)
    assert (none.local, none.for_prefill_worker, none.uncached_tokens) == (True, True, 2048)
    for idle_workers in ([decoder(1), decoder(2)], [prefiller(0), decoder(1), decoder(2)]):
        kept = place(Turn(2048), idle_workers, SETTINGS, BLOCK)
        assert (kept.local, kept.for_prefill_worker) == (True, False)
