"""Decode side of a KV transfer: frames arrive (possibly before the hand-off that names them) and are
matched to requests by chained hashes. A frame holds one layer's K and V for a run of consecutive blocks
and carries its last block's hash, which names the whole run; once every layer of a request is covered
from token 0 to its end, each layer's frames make one [2, tokens, kv_heads, head_dim] tensor (the frame's
own when one covers it all). A request whose frames do not all arrive in time, or that was waiting when
a corrupt frame arrived, is recomputed from its token ids.

A frame may view the sender's memory (sent by reference over shm): it is held, unread, until its request
is assembled, and the caller copies it once into its own blocks (`frames`) and then calls `release`,
which lets the sender reuse that memory; a frame nobody claims is released when it is dropped."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.kv_cache.wire import KVBlock
from engine.workers.messages import Handoff, KVCounters
from engine.workers.worker.layer_sender import wire_hashes

FrameKey = tuple[int, int]  # (hash of the frame's last block, layer)
Release = Callable[[], None]


def _nothing() -> None:
    return None


@dataclass
class _Pending:
    handoff: Handoff
    hashes: list[int]
    deadline: float
    failed: str | None = None  # why the transfer is given up before its deadline


@dataclass
class Assembled:
    handoff: Handoff
    frames: list[list[KVBlock]] | None  # per layer, frames covering its tokens in order; None: recompute
    outcome: str  # received | rejected | timed_out
    release: Release = _nothing  # call once the frames are copied: their senders may reuse the memory

    @property
    def kv_layers(self) -> list[torch.Tensor] | None:
        """One [2, tokens, kv_heads, head_dim] tensor per layer (a copy where a layer took several frames)."""
        if self.frames is None:
            return None
        return [layer[0].tensor if len(layer) == 1 else torch.cat([f.tensor for f in layer], dim=1)
                for layer in self.frames]


@dataclass
class KVAssembler:
    num_layers: int
    block_size: int
    timeout_s: float
    counters: KVCounters = field(default_factory=KVCounters)
    _frames: dict[FrameKey, list[tuple[KVBlock, float, Release]]] = field(default_factory=lambda: defaultdict(list))
    _pending: dict[str, _Pending] = field(default_factory=dict)

    def expect(self, handoff: Handoff, now: float | None = None) -> None:
        hashes = wire_hashes(handoff.prompt_token_ids, self.block_size, handoff.masked_spans,
                             handoff.params.cache_salt, handoff.selection)
        start = time.monotonic() if now is None else now
        self._pending[handoff.request_id] = _Pending(handoff, hashes, start + self.timeout_s)

    @property
    def waiting(self) -> bool:
        """A hand-off is waiting for its frames."""
        return bool(self._pending)

    def add(self, frame: KVBlock, now: float | None = None, release: Release = _nothing) -> None:
        """Keep a frame until its request is assembled; `release` is called when it is no longer read."""
        self._frames[(frame.block_hash, frame.layer)].append((frame, time.monotonic() if now is None else now,
                                                              release))

    def reject(self, reason: str) -> None:
        """A corrupt frame arrived: its request cannot be told, so every incomplete transfer is dropped."""
        self.counters.by_reason[reason] = self.counters.by_reason.get(reason, 0) + 1
        for pending in self._pending.values():
            pending.failed = "rejected"
        self.counters.rejected += 1

    def ready(self, now: float | None = None) -> list[Assembled]:
        now = time.monotonic() if now is None else now
        done = []
        for request_id, pending in list(self._pending.items()):
            covers = None if pending.failed is not None else self._covers(pending)
            if covers is not None:
                frames, release = self._assemble(covers)
                done.append(Assembled(pending.handoff, frames, "received", release))
                self.counters.received += 1
            elif pending.failed is not None or now >= pending.deadline:
                done.append(Assembled(pending.handoff, None, pending.failed or "timed_out"))
                self.counters.timed_out += pending.failed is None
            else:
                continue
            del self._pending[request_id]
        self._drop_stale(now)
        return done

    def _covers(self, pending: _Pending) -> list[list[tuple[FrameKey, KVBlock]]] | None:
        """Per layer, frames covering the request's tokens in order; None while a layer is not covered."""
        covers = []
        for layer in range(self.num_layers):
            cover = self._layer_cover(pending.hashes, len(pending.handoff.prompt_token_ids), layer)
            if cover is None:
                return None
            covers.append(cover)
        return covers

    def _layer_cover(self, hashes: list[int], num_tokens: int, layer: int) -> list[tuple[FrameKey, KVBlock]] | None:
        cover: list[tuple[FrameKey, KVBlock]] = []
        position = 0
        while position < num_tokens:
            step = self._frame_at(hashes, num_tokens, layer, position)
            if step is None:
                return None
            cover.append(step)
            position = step[1].token_end
        return cover

    def _frame_at(self, hashes: list[int], num_tokens: int, layer: int,
                  position: int) -> tuple[FrameKey, KVBlock] | None:
        """The frame of `layer` starting at token `position` that reaches furthest: one ending on a block
        whose hash it carries (a chained hash names the tokens of every block before it too)."""
        for last in range(len(hashes) - 1, position // self.block_size - 1, -1):
            key = (hashes[last], layer)
            end = min((last + 1) * self.block_size, num_tokens)
            for frame, _, _ in self._frames.get(key, ()):
                if frame.token_start == position and frame.token_end == end:
                    return key, frame
        return None

    def _assemble(self, covers: list[list[tuple[FrameKey, KVBlock]]]) -> tuple[list[list[KVBlock]], Release]:
        """The covering frames, taken out of the store, and one call releasing them all."""
        releases: list[Release] = []
        for cover in covers:
            for key, frame in cover:
                releases += [r for f, _, r in self._frames[key] if f is frame]
                self._frames[key] = [entry for entry in self._frames[key] if entry[0] is not frame]

        def release_all() -> None:
            for release in releases:
                release()

        return [[frame for _, frame in cover] for cover in covers], release_all

    def _drop_stale(self, now: float) -> None:
        """Frames nobody claimed within the timeout (their hand-off went elsewhere or never came)."""
        for key in list(self._frames):
            for _, _, release in (entry for entry in self._frames[key] if now - entry[1] >= 2 * self.timeout_s):
                release()
            self._frames[key] = [entry for entry in self._frames[key] if now - entry[1] < 2 * self.timeout_s]
            if not self._frames[key]:
                del self._frames[key]
