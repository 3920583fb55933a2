"""Continuous batching with chunked prefill under a per-step token budget; preemption by recompute.

Pure policy: no torch. Every step, running requests come first (a decode costs one token of the budget,
an unfinished prefill takes the next chunk), then waiting requests are admitted while budget, sequence
slots and KV blocks last. The queue policy (see batcher) orders both queues first: FCFS keeps arrival
order; SLO puts VIP and earliest deadline first. When a running request cannot grow, the last running
request in that order is preempted: its blocks are freed and it waits again at the front, to be
recomputed from its token ids (prompt and outputs so far). No request is ever dropped or duplicated.
Session pins (see kv_pins) give way first: an expired pin is released every step, and a live non-VIP
pin is released before any running request is preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.queue_policy import FcfsPolicy, QueuePolicy
from engine.core.sequence import Sequence, SequenceStatus
from engine.kv_cache.manager import BlockKeys, ExtraKeys, KVCacheBlocks, KVCacheManager
from engine.kv_cache.pins import SessionPins
from engine.model.mask import block_keys


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

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the batch that are prompt, not one decode token per running stream (before update())."""
        return sum(n for seq, n in zip(self.seqs, self.num_new_tokens, strict=True)
                   if seq.num_computed_tokens < seq.num_prompt_tokens)

    @property
    def decode_streams(self) -> int:
        """Sequences the batch decodes a token for, past their prompt (before update())."""
        return sum(1 for seq in self.seqs if seq.num_computed_tokens >= seq.num_prompt_tokens)

    def composition(self) -> list[tuple[int, int, bool]]:
        """Per sequence: new tokens, tokens already in KV, whether it samples a token (before update())."""
        return [(new, seq.num_computed_tokens, self.samples(i)) for i, (seq, new)
                in enumerate(zip(self.seqs, self.num_new_tokens, strict=True))]

    def samples(self, index: int) -> bool:
        """Whether this step computes the sequence's last known token, so a new token is sampled."""
        seq = self.seqs[index]
        return seq.num_computed_tokens + self.num_new_tokens[index] == seq.num_tokens


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 pins: SessionPins | None = None, policy: QueuePolicy | None = None) -> None:
        self.kv = kv
        self.pins = pins or SessionPins(kv)
        self.policy = policy or FcfsPolicy()
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # counter, for metrics

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A request whose KV is already in its blocks (handed over by a prefill worker)."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float = 0.0) -> ScheduledBatch:
        self.pins.expire(now)
        batch = ScheduledBatch()
        self.policy.order_running(self.running)
        budget = self._schedule_running(batch, self.max_num_batched_tokens)
        if not batch.preempted:
            self.policy.order_waiting(self.waiting, now)
            self._schedule_waiting(batch, budget)
        for seq, num_tokens in zip(batch.seqs, batch.num_new_tokens, strict=True):
            self.policy.served(seq, num_tokens, now)
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
        """Allocate room for seq, preempting from the tail of running (the lowest priority); False if seq
        itself went."""
        while self._allocate(seq, seq.num_computed_tokens, num_tokens) is None:
            if self.pins.release_one_for_memory():
                continue
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
            num_tokens = self._admit(seq, budget)
            if num_tokens is None:
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.add(seq, num_tokens)
            budget -= num_tokens

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Find the KV a waiting request already has (its session's pin, else the prefix cache) and
        allocate its first chunk; the chunk's size, or None when there is no room."""
        token_ids = seq.all_token_ids
        pin = self.pins.adopt(seq.session.key, seq.request_id, token_ids) if seq.session else None
        if pin is not None:
            cached_blocks, num_cached = None, len(pin.token_ids)
        else:
            cached_blocks, num_cached = self.kv.get_computed_blocks(token_ids, self._keys(seq))
        num_tokens = min(seq.num_tokens - num_cached, budget)
        while self._allocate(seq, num_cached, num_tokens, cached_blocks) is None:
            if not self.pins.release_one_for_memory():
                if pin is not None and seq.session is not None:
                    self.pins.give_back(seq.session.key, seq.request_id, pin)
                return None
        seq.num_computed_tokens = num_cached
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = num_cached
        return num_tokens

    def _allocate(self, seq: Sequence, num_computed: int, num_tokens: int,
                  cached_blocks: KVCacheBlocks | None = None) -> KVCacheBlocks | None:
        return self.kv.allocate_slots(seq.request_id, seq.all_token_ids, num_computed, num_tokens, cached_blocks,
                                      self._keys(seq))

    def _keys(self, seq: Sequence) -> ExtraKeys | BlockKeys:
        return block_keys(seq.attention_spans, self.kv.block_size, seq.params.cache_salt, seq.selection)

    def update(self, batch: ScheduledBatch, sampled: dict[str, int], forced: dict[str, list[int]] | None = None
               ) -> None:
        """After the model ran: advance computed counts and append the sampled tokens, each followed by the tokens
        its grammar forces (computed by the next step, as one chunk)."""
        for seq, num_tokens in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += num_tokens
            token = sampled.get(seq.request_id)
            if token is not None:
                seq.output_token_ids.append(token)
                seq.output_token_ids += (forced or {}).get(seq.request_id, ())

    def finish(self, seq: Sequence, reason: str, now: float = 0.0) -> None:
        """End a request (stop, length or abort). Its blocks are freed at once, or pinned for its session
        when a turn completed."""
        seq.finish(reason)
        if seq.session is not None and reason != "abort":
            self.pins.pin(seq.session.key, seq.request_id, seq.all_token_ids[:seq.num_computed_tokens],
                          seq.session.ttl_s, seq.session.vip, now)
        else:
            self.kv.free(seq.request_id)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
