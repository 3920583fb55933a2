"""Layer-wise KV streaming from a prefill worker: as soon as a layer of a finishing prefill is computed,
its blocks are queued for a sender thread, so sending overlaps the remaining layers' compute.

Every block, the trailing partial one included, has the chained hash of its tokens (and of the masks
that shaped its KV); the decode side computes the same hashes from the token ids it gets in the
hand-off, which is how it matches frames to requests. A layer's consecutive blocks travel as one frame
(or a few, as many as the transport's frames hold), which carries the hash of its last block.

When the KV cache lives in the transport's registered memory (shm: `ModelRunner.place_kv_caches`), a
layer is not gathered at all: its frames are views of the paged cache, one per run of consecutive blocks,
sent by reference, and the decode side copies them once, straight into its own blocks. The request's
blocks then stay held until the decode side has released every frame (`TransferStats.released`)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from engine.core.llm_engine import LLMEngine
from engine.core.scheduler import ScheduledBatch
from engine.kv_cache.manager import hash_block_tokens
from engine.kv_cache.wire import FORMAT_VERSION, HEADER_SIZE, KVBlock, encode, layer_runs
from engine.model.mask import MaskedSpan, QuerySelection, block_keys
from engine.transport.base import KVSender, TransportError

log = logging.getLogger(__name__)


def wire_hashes(token_ids: Sequence[int], block_size: int, masked_spans: Sequence[MaskedSpan],
                salt: str | None = None, selection: QuerySelection | None = None) -> list[int]:
    keys = block_keys(masked_spans, block_size, salt, selection)
    hashes: list[int] = []
    for index in range(-(-len(token_ids) // block_size)):
        extra = keys(index) if callable(keys) else keys
        chunk = token_ids[index * block_size:(index + 1) * block_size]
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None, chunk, extra))
    return hashes


@dataclass(frozen=True)
class LayerKV:
    """One layer of a finishing prefill, queued for the sender thread: its KV and its blocks' hashes."""

    layer: int
    kv: torch.Tensor  # [2, tokens, kv_heads, head_dim]
    hashes: list[int]

    def runs(self, block_size: int, max_payload_bytes: int) -> list[KVBlock]:
        return layer_runs(self.layer, self.kv, self.hashes, block_size, max_payload_bytes)

    def first_blocks(self, count: int, block_size: int) -> LayerKV:
        """Only the first `count` blocks (a transfer cut on purpose)."""
        return LayerKV(self.layer, self.kv[:, :count * block_size], self.hashes[:count])


@dataclass(frozen=True)
class PagedLayerKV:
    """One layer of a finishing prefill, by reference: where its blocks lie in the layer's paged cache."""

    layer: int
    cache: torch.Tensor  # the layer's whole cache, [2, slots, kv_heads, head_dim]
    block_ids: list[int]  # the request's blocks, one per hash
    num_tokens: int
    hashes: list[int]

    def runs(self, block_size: int, max_payload_bytes: int) -> list[KVBlock]:
        """Views of the cache, one per run of consecutive block ids (of at most `max_payload_bytes`)."""
        block_bytes = self.cache[:, :block_size].nbytes
        most = max(1, max_payload_bytes // block_bytes)
        runs, first = [], 0
        for index in range(1, len(self.block_ids) + 1):
            ends = index == len(self.block_ids) or self.block_ids[index] != self.block_ids[index - 1] + 1
            if ends or index - first == most:
                start, end = first * block_size, min(index * block_size, self.num_tokens)
                slot = self.block_ids[first] * block_size
                runs.append(KVBlock(self.layer, start, end, self.hashes[index - 1],
                                    self.cache[:, slot:slot + end - start]))
                first = index
        return runs

    def first_blocks(self, count: int, block_size: int) -> PagedLayerKV:
        return PagedLayerKV(self.layer, self.cache, self.block_ids[:count], min(self.num_tokens, count * block_size),
                            self.hashes[:count])


@dataclass
class TransferStats:
    bytes: int = 0
    send_seconds: float = 0.0
    last_sent_at: float = 0.0
    pending: int = 0  # layers queued and not yet sent; changed under `lock` (two threads)
    holding: int = 0  # layers sent by reference that the receiver may still read; under `lock`
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def queued(self) -> None:
        with self.lock:
            self.pending += 1
            self.done.clear()

    def sent(self) -> None:
        with self.lock:
            self.pending -= 1
            if self.pending == 0:
                self.done.set()

    def hold(self) -> None:
        with self.lock:
            self.holding += 1

    def unhold(self) -> None:
        with self.lock:
            self.holding -= 1

    def released(self) -> bool:
        """Every layer is sent and no receiver reads the prefill side's blocks: they may be reused."""
        with self.lock:
            return self.pending == 0 and self.holding == 0


RELEASE_POLL_S = 0.001  # how often the sender thread looks for released pulls while some are outstanding
FAULTS = ("corrupt_payload", "wrong_version", "cut", "drop")  # injected on purpose, for failure tests


class LayerStreamer:
    def __init__(self, engine: LLMEngine, connect: Callable[[str], KVSender], fault: str | None = None,
                 by_reference: bool = False) -> None:
        self.engine = engine
        self._connect = connect
        self.by_reference = by_reference  # the KV cache is in the transport's registered memory
        self.fault: str | None = None
        self.set_fault(fault)
        self._senders: dict[str, KVSender] = {}
        self._unreleased = 0  # sends by reference not yet released, as of the sender thread's last poll
        self.targets: dict[str, str] = {}  # request id -> decode worker's KV address
        self.stats: dict[str, TransferStats] = {}
        self._queue: queue.SimpleQueue[tuple[str, TransferStats, str, LayerKV | PagedLayerKV] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._send_loop, name="kv-sender", daemon=True)
        self._thread.start()

    def set_fault(self, fault: str | None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown KV fault {fault!r}; known: {FAULTS}")
        self.fault = fault

    def on_layer(self, batch: ScheduledBatch, layer: int) -> None:
        """Called by the engine after each layer: queue that layer of every prefill finishing now."""
        for index, seq in enumerate(batch.seqs):
            address = self.targets.get(seq.request_id)
            if address is None or not batch.samples(index):
                continue
            hashes = wire_hashes(seq.prompt_token_ids, self.engine.settings.block_size, seq.masked_spans,
                                 seq.params.cache_salt, seq.selection)
            stats = self.stats.setdefault(seq.request_id, TransferStats())
            stats.queued()
            self._queue.put((seq.request_id, stats, address, self._layer_kv(layer, seq.request_id, seq.num_tokens,
                                                                            hashes)))

    def _layer_kv(self, layer: int, request_id: str, num_tokens: int, hashes: list[int]) -> LayerKV | PagedLayerKV:
        block_ids = self.engine.kv.block_ids(request_id)
        if self.by_reference:
            return PagedLayerKV(layer, self.engine.runner.kv_caches[layer], block_ids[:len(hashes)], num_tokens,
                                hashes)
        return LayerKV(layer, self.engine.runner.read_kv(layer, block_ids, num_tokens), hashes)

    def finish(self, request_id: str, timeout_s: float = 30.0) -> tuple[TransferStats, float]:
        """Wait until the request's KV is sent; (stats, seconds of sending left after compute ended)."""
        computed_at = time.monotonic()
        self.targets.pop(request_id, None)
        stats = self.stats.pop(request_id, TransferStats())
        if stats.pending:
            stats.done.wait(timeout_s)
        return stats, max(0.0, stats.last_sent_at - computed_at)

    def _send_with_retry(self, request_id: str, address: str, layer: LayerKV | PagedLayerKV,
                         stats: TransferStats) -> None:
        """A connection the receiver dropped (after a bad frame, say) is replaced once; if that fails too,
        the decode side times out and recomputes."""
        for attempt in (1, 2):
            try:
                self._send(address, layer, stats)
                return
            except (OSError, EOFError, TransportError) as error:
                log.warning("KV transfer of %s to %s failed (attempt %d): %s", request_id, address, attempt, error)
                stale = self._senders.pop(address, None)
                if stale is not None:
                    with contextlib.suppress(OSError, TransportError):
                        stale.close()

    def _send(self, address: str, layer: LayerKV | PagedLayerKV, stats: TransferStats) -> None:
        """The layer's blocks as runs of consecutive ones, one frame each (as many as the sender's frames hold)."""
        sender = self._senders.get(address) or self._senders.setdefault(address, self._connect(address))
        if self.fault in ("cut", "drop"):
            count = len(layer.hashes) // 2 if self.fault == "cut" else 0
            layer = layer.first_blocks(count, self.engine.settings.block_size)
        runs = layer.runs(self.engine.settings.block_size, sender.coalesce_bytes)
        if self.fault in ("corrupt_payload", "wrong_version"):
            for run in runs:
                sender.send_frame(_faulty_frame(run, self.fault))
        else:
            stats.hold()
            try:
                sender.send_many(runs, on_released=stats.unhold)
            except BaseException:
                stats.unhold()  # the receiver is gone (or stalled past the timeout): nothing reads these blocks
                raise
        stats.bytes += sum(run.tensor.nbytes for run in runs)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        for sender in self._senders.values():
            sender.close()

    def _send_loop(self) -> None:
        while (item := self._next_item()) is not None:
            if isinstance(item, tuple):
                request_id, stats, address, layer = item  # the stats object itself: finish() may pop its entry
                started = time.monotonic()
                self._send_with_retry(request_id, address, layer, stats)
                stats.last_sent_at = time.monotonic()
                stats.send_seconds += stats.last_sent_at - started
                stats.sent()
            self._poll_releases()

    def _next_item(self) -> tuple[str, TransferStats, str, LayerKV | PagedLayerKV] | bool | None:
        """The next layer to send; False after a short wait while receivers still read our memory (time to
        poll their releases again); None to stop."""
        try:
            return self._queue.get(timeout=RELEASE_POLL_S if self._unreleased else None)
        except queue.Empty:
            return False

    def _poll_releases(self) -> None:
        """Call `on_released` of what receivers are done with (on this thread, the senders' only user)."""
        self._unreleased = 0
        for sender in list(self._senders.values()):
            with contextlib.suppress(OSError, TransportError):
                self._unreleased += sender.poll()


def _faulty_frame(block: KVBlock, fault: str) -> bytes:
    frame = bytearray(encode(block).tobytes())
    if fault == "corrupt_payload":
        frame[HEADER_SIZE] ^= 0xFF
    else:
        frame[4:6] = (FORMAT_VERSION + 1).to_bytes(2, "big")
    return bytes(frame)
