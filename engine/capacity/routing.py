"""Conditional disaggregation and KV-aware routing of one turn.

The decode worker is the one with the lowest cost = `overlap_weight` x KV blocks to move + load, where the
blocks to move are the prompt's blocks that worker does not hold (they must be prefilled and shipped to it,
or prefilled there) and the load is `running + waiting_prefill_tokens / block_size`: requests it holds plus
its queued prompt tokens in blocks. With the default weight 1, one block to move costs as much as one more
request on the worker. Ties go to the lowest worker id.

The turn is then prefilled on that decode worker itself (no KV transfer) when its uncached delta is small:
below `local_prefill_max_tokens` tokens, or below `local_prefill_max_uncached_share` of the prompt (Dynamo's
conditional disaggregation), and, while that worker has streams decoding, short enough at its measured prefill
rate not to hold them past `local_prefill_max_stall_s` (DistServe's interference: on a slow model a "small"
delta of 200 tokens is a second of prefill that every stream on the worker waits out), unless sparing them
costs more waiting than it spares: a prefill worker that lacks the history computes all of it, so the turn
stays local when that would take longer than the stall times the streams it holds; or whatever its size
when nothing runs on that decode worker nor on any prefill worker: an idle deployment has no interference for
disaggregation to avoid, and the KV transfer would only add latency; or when the least-loaded prefill worker's
queue would take longer than `remote_prefill_max_queue_s` to drain at its measured rate and the decode worker's
own queue is shorter (Dynamo's `max_prefill_queue_size`, in seconds: prefill workers that fall behind would
hold the turn longer than prefilling it where it decodes). Otherwise the prefill worker of the lowest cost (as
the decode worker's: `overlap_weight` x the prompt's blocks it does not hold + load; with the weight 0, the
least loaded) computes the delta and streams it. With both thresholds 0 (DistServe) every turn is prefilled
remotely, idle or not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import DECODE, PREFILL, WorkerLoad


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    session_key: str | None = None
    cached_tokens: Mapping[int, int] = field(default_factory=dict)  # worker id -> leading prompt tokens it holds

    def uncached_on(self, worker_id: int) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens.get(worker_id, 0))


@dataclass(frozen=True)
class DecodeChoice:
    worker_id: int
    uncached_tokens: int
    blocks_to_move: int
    cost: float


@dataclass(frozen=True)
class Placement:
    decode_worker: int
    prefill_worker: int | None  # None: prefilled locally on the decode worker
    local: bool
    reason: str
    uncached_tokens: int = 0  # the delta to prefill, on the decode worker chosen
    # a prefill worker computes it, or would if the deployment had one (the turn failed the local gate and nothing
    # else keeps it local). The capacity controller's prefill demand is these turns'; the others are prefill work
    # of the decode workers.
    for_prefill_worker: bool = False


def worker_load(worker: WorkerLoad, block_size: int) -> float:
    return worker.running + worker.waiting_prefill_tokens / block_size


def blocks_to_move(uncached_tokens: int, block_size: int) -> int:
    return -(-uncached_tokens // block_size)


def choose_decode_worker(turn: Turn, workers: Sequence[WorkerLoad], settings: CapacitySettings,
                         block_size: int) -> DecodeChoice:
    """The cheapest of `workers` (the caller passes the decode workers) to decode this turn."""
    if not workers:
        raise ValueError("no worker to decode on")
    best: tuple[float, int, int, int] | None = None  # (cost, worker id, uncached tokens, blocks to move)
    for worker in workers:
        uncached = turn.uncached_on(worker.worker_id)
        blocks = blocks_to_move(uncached, block_size)
        cost = settings.overlap_weight * blocks + worker_load(worker, block_size)
        if best is None or (cost, worker.worker_id) < best[:2]:
            best = (cost, worker.worker_id, uncached, blocks)
    assert best is not None
    cost, worker_id, uncached, blocks = best
    return DecodeChoice(worker_id, uncached, blocks, cost)


def choose_prefill_worker(turn: Turn, workers: Sequence[WorkerLoad], settings: CapacitySettings,
                          block_size: int) -> WorkerLoad:
    """The cheapest prefill worker: the prompt's blocks it would compute, weighted, plus its load (ties: lowest id).
    A prefill worker holds a prefix where the caller's `turn.cached_tokens` says so (its last prefill of the
    session, prefix caching on)."""
    def cost(worker: WorkerLoad) -> tuple[float, int]:
        blocks = blocks_to_move(turn.uncached_on(worker.worker_id), block_size)
        return settings.overlap_weight * blocks + worker_load(worker, block_size), worker.worker_id

    return min(workers, key=cost)


def prefill_locally(uncached_tokens: int, prompt_tokens: int, settings: CapacitySettings) -> bool:
    """Dynamo's rule: a small uncached delta, in tokens or as a share of the prompt, is not worth a transfer."""
    if uncached_tokens < settings.local_prefill_max_tokens or prompt_tokens <= 0:
        return True
    return uncached_tokens / prompt_tokens < settings.local_prefill_max_uncached_share


def stalls_decoding(worker: WorkerLoad, uncached_tokens: int, settings: CapacitySettings) -> bool:
    """Prefilling the delta on this worker would hold its decoding streams past the stall bound."""
    bound, rate = settings.local_prefill_max_stall_s, worker.stall_tokens_per_s
    return bool(bound and worker.decode_streams and rate and uncached_tokens / rate > bound)


def sparing_pays(turn: Turn, decoder: WorkerLoad, prefiller: WorkerLoad, uncached_tokens: int) -> bool:
    """Prefilling on `prefiller` delays this turn by what that worker lacks of the prompt, at its rate (the
    decode worker's stall rate where it has none yet), for no longer than prefilling locally would delay the decode
    worker's streams: what the delta adds to their steps, once per stream (only called when the delta stalls
    them)."""
    rate = decoder.stall_tokens_per_s
    assert rate, "a stall is only measured at a known prefill rate"
    remote_s = turn.uncached_on(prefiller.worker_id) / (prefiller.prefill_tokens_per_s or rate)
    return remote_s <= decoder.decode_streams * uncached_tokens / rate


def queue_s(worker: WorkerLoad) -> float:
    """Seconds its queued prompt tokens take at its measured rate (0 until it measured one)."""
    rate = worker.prefill_tokens_per_s
    return worker.waiting_prefill_tokens / rate if rate else 0.0


def prefill_queue_full(decoder: WorkerLoad, prefiller: WorkerLoad, settings: CapacitySettings) -> bool:
    """Dynamo's max_prefill_queue_size, in seconds: the prefill worker's queue is past the bound and the decode
    worker's own is shorter, so the turn waits less prefilled where it decodes."""
    bound = settings.remote_prefill_max_queue_s
    return bool(bound and queue_s(prefiller) > bound and queue_s(decoder) < queue_s(prefiller))


def idle(worker: WorkerLoad) -> bool:
    return worker.running == 0 and worker.waiting_prefill_tokens == 0


def conditional(settings: CapacitySettings) -> bool:
    """Conditional disaggregation is on: some turns may be prefilled on their decode worker."""
    return settings.local_prefill_max_tokens > 0 or settings.local_prefill_max_uncached_share > 0


def place(turn: Turn, workers: Sequence[WorkerLoad], settings: CapacitySettings, block_size: int) -> Placement:
    """Where this turn decodes and whether (and where) it is prefilled elsewhere. With no decode worker every
    worker may decode; with no prefill worker the turn is prefilled locally."""
    decoders = [w for w in workers if w.role == DECODE] or list(workers)
    choice = choose_decode_worker(turn, decoders, settings, block_size)
    share = choice.uncached_tokens / turn.prompt_tokens if turn.prompt_tokens else 0.0
    delta = f"{choice.uncached_tokens} uncached of {turn.prompt_tokens} tokens ({share:.0%})"
    decoder = next(w for w in decoders if w.worker_id == choice.worker_id)
    small = prefill_locally(choice.uncached_tokens, turn.prompt_tokens, settings)
    if small and not stalls_decoding(decoder, choice.uncached_tokens, settings):
        return Placement(choice.worker_id, None, True, f"local: {delta} on worker {choice.worker_id}",
                         choice.uncached_tokens)
    prefillers = [w for w in workers if w.role == PREFILL and w.worker_id != choice.worker_id]

    def local(reason: str, for_prefill_worker: bool = False) -> Placement:
        return Placement(choice.worker_id, None, True, reason, choice.uncached_tokens, for_prefill_worker)

    if not prefillers:  # one would take it, unless the deployment is idle (the rule below)
        return local(f"local: no prefill worker; {delta}", not (conditional(settings) and idle(decoder)))
    prefiller = choose_prefill_worker(turn, prefillers, settings, block_size)
    if small and not sparing_pays(turn, decoder, prefiller, choice.uncached_tokens):
        return local(f"local: {delta}; prefill worker {prefiller.worker_id} would compute "
                     f"{turn.uncached_on(prefiller.worker_id)}, longer than the stall it spares")
    if small:
        hold_ms = 1000 * choice.uncached_tokens / (decoder.stall_tokens_per_s or 1.0)
        delta += (f", too slow to prefill beside worker {choice.worker_id}'s {decoder.decode_streams} streams "
                  f"(holds them {hold_ms:.0f} ms)")
    if conditional(settings) and idle(decoder) and all(idle(w) for w in prefillers):
        return local(f"local: nothing running; {delta}")
    if conditional(settings) and prefill_queue_full(decoder, prefiller, settings):
        return local(f"local: {delta}; prefill worker {prefiller.worker_id}'s queue holds {queue_s(prefiller):.2f} s")
    return Placement(choice.worker_id, prefiller.worker_id, False,
                     f"remote: {delta}, prefill on worker {prefiller.worker_id}, decode on {choice.worker_id}",
                     choice.uncached_tokens, for_prefill_worker=True)
