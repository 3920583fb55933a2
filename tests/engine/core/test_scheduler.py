"""Scheduler policy with the real block manager; the model is replaced by a deterministic next token."""

from __future__ import annotations

from engine.core.sampling.sampler import SamplingParams
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.kv_cache.manager import KVCacheManager


def next_token(seq: Sequence) -> int:
    """What a deterministic model would emit after seq's tokens."""
    return (sum(seq.all_token_ids) * 31 + seq.num_tokens) % 1000


def run_to_completion(scheduler: Scheduler, seqs: list[Sequence], budget: int,
                      max_steps: int = 10_000) -> list[ScheduledBatch]:
    for seq in seqs:
        scheduler.add(seq)
    batches = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return batches
        batch = scheduler.schedule()
        assert batch.num_tokens <= budget
        assert len({s.request_id for s in batch.seqs}) == len(batch.seqs), "a request scheduled twice"
        sampled = {s.request_id: next_token(s) for i, s in enumerate(batch.seqs) if batch.samples(i)}
        scheduler.update(batch, sampled)
        for seq in batch.seqs:
            if seq.request_id in sampled and len(seq.output_token_ids) == seq.params.max_tokens:
                scheduler.finish(seq, "length")
        batches.append(batch)
    raise AssertionError("scheduler did not finish")


def expected_outputs(prompt: list[int], max_tokens: int) -> list[int]:
    seq = Sequence("ref", list(prompt), SamplingParams(max_tokens=max_tokens))
    for _ in range(max_tokens):
        seq.output_token_ids.append(next_token(seq))
    return seq.output_token_ids


def make_seqs(lengths: list[int], max_tokens: int) -> list[Sequence]:
    return [Sequence(f"r{i}", [(i * 7 + j) % 100 for j in range(n)], SamplingParams(max_tokens=max_tokens))
            for i, n in enumerate(lengths)]


def test_chunked_prefill_respects_budget_and_completes_all() -> None:
    kv = KVCacheManager(num_blocks=200, block_size=4)
    scheduler = Scheduler(kv, max_num_batched_tokens=16, max_num_seqs=8)
    seqs = make_seqs([40, 3, 17, 9], max_tokens=5)
    batches = run_to_completion(scheduler, seqs, budget=16)
    first = batches[0]
    assert first.seqs[0].request_id == "r0" and first.num_new_tokens == [16]  # a 40-token prompt is chunked
    for seq in seqs:
        assert seq.output_token_ids == expected_outputs(seq.prompt_token_ids, 5)
        assert seq.status is SequenceStatus.FINISHED
    assert kv.num_free_blocks == 200


def test_preemption_by_recompute_loses_and_duplicates_nothing() -> None:
    kv = KVCacheManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    scheduler = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    seqs = make_seqs([10, 10, 10, 10], max_tokens=12)
    batches = run_to_completion(scheduler, seqs, budget=64)
    assert any(b.preempted for b in batches), "the pool is too small for all four: someone must be preempted"
    assert sum(s.num_preemptions for s in seqs) > 0
    for seq in seqs:
        assert seq.output_token_ids == expected_outputs(seq.prompt_token_ids, 12)
    assert kv.num_free_blocks == 12


def test_decodes_come_first_and_waiting_admitted_in_order() -> None:
    kv = KVCacheManager(num_blocks=100, block_size=4)
    scheduler = Scheduler(kv, max_num_batched_tokens=8, max_num_seqs=2)
    a, b, c = make_seqs([4, 4, 4], max_tokens=3)
    for seq in (a, b, c):
        scheduler.add(seq)
    batch = scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == ["r0", "r1"]  # max_num_seqs caps admission
    scheduler.update(batch, {s.request_id: 1 for s in batch.seqs})
    batch = scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == ["r0", "r1"] and batch.num_new_tokens == [1, 1]
    scheduler.finish(a, "stop")
    scheduler.update(batch, {"r1": 1})
    batch = scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == ["r1", "r2"]
    assert (batch.decode_streams, batch.prompt_tokens) == (1, 4)  # r1 decodes beside r2's prompt


def test_prefix_cache_hit_is_recorded_once() -> None:
    kv = KVCacheManager(num_blocks=100, block_size=4)
    scheduler = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    [first] = make_seqs([13], max_tokens=2)
    run_to_completion(scheduler, [first], budget=64)
    again = Sequence("again", list(first.prompt_token_ids), SamplingParams(max_tokens=2))
    run_to_completion(scheduler, [again], budget=64)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 12  # three full blocks of four
    assert again.output_token_ids == first.output_token_ids


def test_finish_while_waiting_frees_and_removes() -> None:
    kv = KVCacheManager(num_blocks=100, block_size=4)
    scheduler = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    [seq] = make_seqs([5], max_tokens=2)
    scheduler.add(seq)
    scheduler.finish(seq, "abort")
    assert not scheduler.has_unfinished() and seq.finish_reason == "abort"
