"""Decode side of a KV transfer: Layer Blocks arrive (possibly before the hand-off that names them) and
are matched to requests by their chained hashes; once every layer of every block is in, they are
assembled into one [2, tokens, kv_heads, head_dim] tensor per layer. A request whose blocks do not all
arrive in time, or that was waiting when a corrupt block arrived, is recomputed from its token ids."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from engine.handoff import Handoff
from engine.kv_wire import KVBlock
from engine.worker.kv_stream import wire_hashes
from engine.worker.messages import KVCounters


@dataclass
class _Pending:
    handoff: Handoff
    hashes: list[int]
    deadline: float
    failed: str | None = None  # why the transfer is given up before its deadline


@dataclass
class Assembled:
    handoff: Handoff
    kv_layers: list[torch.Tensor] | None  # None: recompute
    outcome: str  # received | rejected | timed_out


@dataclass
class KVAssembler:
    num_layers: int
    block_size: int
    timeout_s: float
    counters: KVCounters = field(default_factory=KVCounters)
    _blocks: dict[tuple[int, int], list[tuple[KVBlock, float]]] = field(default_factory=lambda: defaultdict(list))
    _pending: dict[str, _Pending] = field(default_factory=dict)

    def expect(self, handoff: Handoff, now: float | None = None) -> None:
        hashes = wire_hashes(handoff.prompt_token_ids, self.block_size, handoff.masked_spans)
        start = time.monotonic() if now is None else now
        self._pending[handoff.request_id] = _Pending(handoff, hashes, start + self.timeout_s)

    def add(self, block: KVBlock, now: float | None = None) -> None:
        self._blocks[(block.block_hash, block.layer)].append((block, time.monotonic() if now is None else now))

    def reject(self, reason: str) -> None:
        """A corrupt block arrived: its request cannot be told, so every incomplete transfer is dropped."""
        self.counters.by_reason[reason] = self.counters.by_reason.get(reason, 0) + 1
        for pending in self._pending.values():
            pending.failed = "rejected"
        self.counters.rejected += 1

    def ready(self, now: float | None = None) -> list[Assembled]:
        now = time.monotonic() if now is None else now
        done = []
        for request_id, pending in list(self._pending.items()):
            if pending.failed is None and self._complete(pending):
                done.append(Assembled(pending.handoff, self._assemble(pending), "received"))
                self.counters.received += 1
            elif pending.failed is not None or now >= pending.deadline:
                done.append(Assembled(pending.handoff, None, pending.failed or "timed_out"))
                self.counters.timed_out += pending.failed is None
            else:
                continue
            del self._pending[request_id]
        self._drop_stale(now)
        return done

    def _complete(self, pending: _Pending) -> bool:
        return all(self._blocks.get((h, layer)) for h in pending.hashes for layer in range(self.num_layers))

    def _assemble(self, pending: _Pending) -> list[torch.Tensor]:
        layers = []
        for layer in range(self.num_layers):
            parts = [self._blocks[(h, layer)].pop(0)[0] for h in pending.hashes]
            layers.append(torch.cat([p.tensor for p in sorted(parts, key=lambda b: b.token_start)], dim=1))
        return layers

    def _drop_stale(self, now: float) -> None:
        """Blocks nobody claimed within the timeout (their hand-off went elsewhere or never came)."""
        for key in list(self._blocks):
            self._blocks[key] = [(b, t) for b, t in self._blocks[key] if now - t < 2 * self.timeout_s]
            if not self._blocks[key]:
                del self._blocks[key]
