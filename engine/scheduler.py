"""Continuous batching with chunked prefill under a per-step token budget; preemption by recompute.

Pure policy: no torch. Every step, running requests come first (a decode costs one token of the budget,
an unfinished prefill takes the next chunk), then waiting requests are admitted in arrival order while
budget, sequence slots and KV blocks last. When a running request cannot grow, the most recently
admitted running request is preempted: its blocks are freed and it waits again at the front, to be
recomputed from its token ids (prompt and outputs so far). No request is ever dropped or duplicated.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import KVCacheManager
from engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # per entry of seqs
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, index: int) -> bool:
        """Whether this step computes the sequence's last known token, so a new token is sampled."""
        seq = self.seqs[index]
        return seq.num_computed_tokens + self.num_new_tokens[index] == seq.num_tokens


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # counter, for metrics

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self._schedule_running(batch, self.max_num_batched_tokens)
        if not batch.preempted:
            self._schedule_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            if not self._grow_or_preempt(seq, num_tokens, batch):
                break
            batch.add(seq, num_tokens)
            budget -= num_tokens
            index += 1
        return budget

    def _grow_or_preempt(self, seq: Sequence, num_tokens: int, batch: ScheduledBatch) -> bool:
        """Allocate room for seq, preempting from the tail of running; False if seq itself went."""
        while self.kv.allocate_slots(seq.request_id, seq.all_token_ids, seq.num_computed_tokens,
                                     num_tokens) is None:
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.request_id)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            token_ids = seq.all_token_ids
            cached_blocks, num_cached = self.kv.get_computed_blocks(token_ids)
            num_tokens = min(seq.num_tokens - num_cached, budget)
            if self.kv.allocate_slots(seq.request_id, token_ids, num_cached, num_tokens, cached_blocks) is None:
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_cached
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.add(seq, num_tokens)
            budget -= num_tokens

    def update(self, batch: ScheduledBatch, sampled: dict[str, int]) -> None:
        """After the model ran: advance computed counts and append the sampled tokens."""
        for seq, num_tokens in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += num_tokens
            token = sampled.get(seq.request_id)
            if token is not None:
                seq.output_token_ids.append(token)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a request (stop, length or abort) and free its blocks at once."""
        seq.finish(reason)
        self.kv.free(seq.request_id)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
