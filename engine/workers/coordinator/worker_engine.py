"""The disaggregated engine as the serving process sees it: starts the worker processes, places each
request (the decode worker holding most of its session's KV, and a prefill worker unless the uncached
delta is small enough to prefill where it decodes), relays outputs, and lets the capacity controller move
workers between roles. Same surface as the colocated `LLMEngine` (add_request / step / abort / stats /
kv_tier_stats / set_session_ttl), so the gateway serves either.

A worker that dies is detected (its pipe closes or its process ends); its requests are re-run on the
remaining workers from their token ids, skipping the tokens already streamed (identical for greedy and
for seeded sampling)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from engine.capacity.loop import CapacityLoop
from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.llm_engine import Completion, run_to_completion
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import RequestError, SamplingParams
from engine.core.sequence import SessionRef
from engine.core.slo import load_slo_config
from engine.core.stats import AgentSignals, EngineStats, WorkerReport
from engine.core.validation import Prompt, RequestValidator, load_tokenizer_or_none, num_kv_blocks, read_model_config
from engine.kv_cache.sizing import sized_settings
from engine.model.mask import MaskedSpan, QuerySelection
from engine.workers import messages as m
from engine.workers.coordinator.handles import WorkerHandle
from engine.workers.coordinator.placement import Placer
from engine.workers.coordinator.pool import WorkerPool
from engine.workers.coordinator.queries import WorkerQueries
from engine.workers.coordinator.session_homes import SessionHomes
from engine.workers.coordinator.tracking import Tracked, TransferLog
from engine.workers.deployment import DeploymentSettings

log = logging.getLogger(__name__)
SENDING_POLL_S = 0.001  # a step's longest wait while commands wait for room in a worker's pipe
LIVENESS_POLL_S = 0.02  # between checks that each worker process is alive (a dead one's pipe also ends at once)


class WorkerEngine:
    steps_when_idle = True  # idle workers still report (released pins, restarts, nodes joining)

    def __init__(self, model: str, settings: EngineSettings | None = None,
                 deployment: DeploymentSettings | None = None, capacity: CapacitySettings | None = None) -> None:
        """capacity None: no capacity controller (the roles stay as deployed; the colocated engine)."""
        self.deployment = deployment or DeploymentSettings()
        self.config, self.checkpoint = read_model_config(model)
        self.settings = sized_settings(self.config, settings or EngineSettings(), model,
                                       engines=self.deployment.prefill + self.deployment.decode, weights_loaded=False)
        self.max_model_len = self.config.max_position_embeddings
        self.tokenizer = load_tokenizer_or_none(self.checkpoint)
        self.validator = RequestValidator(self.config, self.tokenizer, self.settings.block_size,
                                          num_kv_blocks(self.config, self.settings),
                                          frozenset(load_slo_config().classes))
        self.pool = WorkerPool(model, self.settings, self.deployment)
        self.workers = self.pool.workers
        self.homes = SessionHomes(self.settings.block_size)
        self.placer = Placer(self.workers, self.homes, capacity or CapacitySettings(), self.settings.block_size)
        self.colocated = capacity is None and len(self.workers) == 1  # one worker doing it all, never moved
        self.queries = WorkerQueries(self.workers, self.homes, self._send, self.step, self.colocated)
        self.capacity = (None if capacity is None else
                         CapacityLoop(capacity, self.workers, self.queries.set_role, self.settings.max_num_seqs))
        self.queries.capacity = self.capacity
        self.parked: list[Tracked] = []  # requests with no live worker, while a dead one is started again
        self.tracked: dict[str, Tracked] = {}
        self.by_attempt: dict[str, Tracked] = {}
        self.transfers = TransferLog()
        self.role_switches: list[float] = []  # seconds from SetRole to applied, offset-corrected
        self.dead_workers: list[int] = []
        self.stopping = False
        self._ids = itertools.count()
        self._wake_r, self._wake_w = socket.socketpair()
        self._liveness_due = 0.0  # monotonic time of the next check of the worker processes
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # the serving-engine surface the workers answer, through `queries`
    def stats(self) -> EngineStats:
        return self.queries.stats()

    def worker_reports(self) -> list[WorkerReport]:
        return self.queries.worker_reports()

    def kv_tier_stats(self) -> dict[str, Any] | None:
        return self.queries.kv_tier_stats()

    def set_session_ttl(self, key: str, ttl_s: float) -> bool:
        return self.queries.set_session_ttl(key, ttl_s)

    def update_signals(self, signals: AgentSignals) -> None:
        self.queries.update_signals(signals)

    def set_role(self, worker_id: int, role: str) -> None:
        self.queries.set_role(worker_id, role)

    def kv_counters(self, timeout_s: float = 10.0) -> dict[int, m.KVCounters]:
        return self.queries.kv_counters(timeout_s)

    def reset_prefix_cache(self, timeout_s: float = 10.0) -> bool:
        return self.queries.reset_prefix_cache(timeout_s)

    def inject_kv_fault(self, fault: str | None) -> None:
        self.queries.inject_kv_fault(fault)

    def tokenize(self, prompt: Prompt) -> list[int]:
        return self.validator.tokenize(prompt)

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        return self.validator.validate(prompt, params)

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
                    masked_spans: Sequence[MaskedSpan] = (), session: SessionRef | None = None,
                    selection: QuerySelection | None = None) -> str:
        token_ids = self.validate(prompt, params)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.tracked:
            raise RequestError(f"request id {request_id!r} is already running")
        if any(span.end > len(token_ids) for span in masked_spans):
            raise RequestError(f"a masked span ends past the prompt's {len(token_ids)} tokens")
        tracked = Tracked(request_id, token_ids, params, tuple(masked_spans), session, selection)
        self.tracked[request_id] = tracked
        self._dispatch(tracked)
        return request_id

    def _dispatch(self, tracked: Tracked) -> None:
        """Place and send an attempt; a worker found dead on sending is buried and the attempt placed again."""
        self.by_attempt[tracked.attempt_id] = tracked
        tracked.worker_ids = set()
        if not any(w.alive for w in self.workers) and self.pool.starting():
            self.parked.append(tracked)
            return
        placement = self.placer.place(tracked.session, tracked.token_ids, self._loads())
        if self.capacity is not None:
            self.capacity.routed.placed(tracked.request_id, placement.uncached_tokens, placement.for_prefill_worker)
        submit = m.Submit(tracked.attempt_id, tracked.token_ids, tracked.params,
                          tracked.masked_spans, session=tracked.session, selection=tracked.selection)
        decode = self.workers[placement.decode_worker]
        if placement.prefill_worker is None:
            if not self._send(decode, submit):
                self._dispatch(tracked)
                return
            self.transfers.local_prefills += 1
            tracked.worker_ids = {decode.worker_id}
            return
        prefill = self.workers[placement.prefill_worker]
        if not self._send(decode, m.ExpectKV(tracked.attempt_id)) or \
                not self._send(prefill, replace(submit, decode_address=decode.kv_addresses[prefill.worker_id])):
            self._dispatch(tracked)
            return
        tracked.worker_ids = {prefill.worker_id}
        prefill.pending_decode[tracked.attempt_id] = decode.worker_id

    def _send(self, worker: WorkerHandle, command: m.Command) -> bool:
        """False when the worker's pipe is broken: it died between two liveness checks (its requests re-run)."""
        try:
            worker.send(command)
        except OSError:  # BrokenPipeError, ConnectionResetError
            self._worker_died(worker)
            return False
        if isinstance(command, m.Submit | m.AcceptHandoff | m.Abort):
            worker.report_due = True  # its load changes: a Load will follow, the last one once it is idle
        return True

    def _loads(self) -> dict[int, int]:
        """Requests each worker is busy with, as the coordinator knows them (placement's load): a request being
        prefilled counts on its decode worker too, so a burst spreads over the decoders."""
        loads = {w.worker_id: 0 for w in self.workers if w.alive}
        bound = [w for tracked in self.tracked.values() for w in tracked.worker_ids]
        bound += [decoder for w in self.workers for decoder in w.pending_decode.values()]
        for worker_id in bound:
            if worker_id in loads:
                loads[worker_id] += 1
        return loads

    def abort(self, request_id: str) -> None:
        tracked = self.tracked.pop(request_id, None)
        if self.capacity is not None:
            self.capacity.routed.done(request_id)
        if tracked in self.parked:
            self.parked.remove(tracked)
        if tracked is not None:
            announced = {w.pending_decode[tracked.attempt_id] for w in self.workers
                         if tracked.attempt_id in w.pending_decode}  # its decode worker expects the KV (ExpectKV)
            for worker in self.workers:
                if worker.worker_id in tracked.worker_ids | announced and worker.alive:
                    self._send(worker, m.Abort(tracked.attempt_id))

    def has_unfinished(self) -> bool:
        """Requests in flight, or a worker that is busy or owes a Load report: keep stepping until every worker
        has reported idle after its last work, so stats and the capacity controller see the end of the work
        (a request that ends before its worker's next report would otherwise leave that report unread)."""
        return bool(self.tracked) or any(w.alive and (w.stats.running or w.report_due) for w in self.workers)

    def wakeup(self) -> None:
        """Cut a step's wait short (new work arrived from another thread)."""
        with contextlib.suppress(BlockingIOError):  # a full buffer: a wake-up is already pending
            self._wake_w.send(b"\0")

    def step(self, timeout_s: float = 0.05) -> list[RequestOutput]:
        """Wait up to timeout_s for a worker's events (0: only what is in) and handle them; the outputs."""
        outputs: list[RequestOutput] = []
        if not self.flush_sends():
            timeout_s = min(timeout_s, SENDING_POLL_S)
        ready = wait([w.conn for w in self.workers if w.alive and w.conn] + [self._wake_r], timeout_s)
        if self._wake_r in ready:
            self._drain_wakeups()
        for worker in self.workers:
            if worker.conn in ready and worker.alive:
                outputs += self._drain(worker)
        now = time.monotonic()
        if now >= self._liveness_due:
            self._check_liveness()
            self._liveness_due = now + LIVENESS_POLL_S
        self._tend_pool(now)
        if self.capacity is not None:
            self.capacity.tick(now)
        return outputs

    def flush_sends(self) -> bool:
        """Write the commands a full pipe held back; True when none is left waiting."""
        for worker in self.workers:
            if worker.alive and worker.sending:
                try:
                    worker.flush()
                except OSError:
                    self._worker_died(worker)
        return not any(w.alive and w.sending for w in self.workers)

    def _tend_pool(self, now: float) -> None:
        """Workers that finished (re)starting take the parked requests; new nodes get workers."""
        serving = self.pool.advance()
        self.pool.watch_nodes(now)
        if self.parked and (serving or not self.pool.starting()):
            parked, self.parked = self.parked, []
            for tracked in parked:
                self._dispatch(tracked)

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _drain(self, worker: WorkerHandle) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        conn = worker.conn
        try:
            while conn is not None and conn.poll() and worker.alive:
                outputs += self._on_event(worker, conn.recv())
        except (EOFError, OSError):
            self._worker_died(worker)
        return outputs

    def _on_event(self, worker: WorkerHandle, event: m.Event) -> list[RequestOutput]:
        if self.queries.answered(event):
            return []
        if isinstance(event, m.Outputs):
            return [out for raw in event.outputs if (out := self._relay(worker, raw)) is not None]
        if isinstance(event, m.Load):
            worker.stats, worker.kv_tiers, worker.report_due = event.stats, event.kv_tiers, False
        elif isinstance(event, m.Prefilled):
            self._forward_handoff(worker, event)
        elif isinstance(event, m.RoleChanged):
            latency = max(0.0, event.applied_at - worker.clock_offset_s - event.sent_at)
            self.role_switches.append(latency)
            if self.capacity is not None:
                self.capacity.role_applied(time.monotonic(), worker.worker_id, event.role, latency)
        elif isinstance(event, m.Listening):
            self.pool.listening(event)
        return []

    def _forward_handoff(self, worker: WorkerHandle, event: m.Prefilled) -> None:
        self.transfers.requests += 1
        self.transfers.bytes += event.kv_bytes
        self.transfers.send_seconds += event.send_seconds
        self.transfers.exposed_seconds += event.exposed_seconds
        decode_id = worker.pending_decode.pop(event.handoff.request_id)
        tracked = self.by_attempt.get(event.handoff.request_id)
        decode = self.workers[decode_id]
        if tracked is None:
            return
        if not decode.alive or not self._send(decode, m.AcceptHandoff(event.handoff)):
            self._rerun(tracked)
            return
        tracked.worker_ids = {decode.worker_id}

    def _relay(self, worker: WorkerHandle, raw: RequestOutput) -> RequestOutput | None:
        tracked = self.by_attempt.get(raw.request_id)
        if tracked is None or tracked.request_id not in self.tracked:
            return None
        prefilling = tracked.first_token_at is None
        out = tracked.relay(raw)
        if prefilling and tracked.first_token_at is not None and self.capacity is not None:
            self.capacity.routed.done(tracked.request_id)  # past its prefill
        if out.finished:
            self._finished(worker, tracked, out.finish_reason)
        return out

    def _finished(self, worker: WorkerHandle, tracked: Tracked, reason: str | None) -> None:
        del self.tracked[tracked.request_id]
        self.by_attempt.pop(tracked.attempt_id, None)
        now = time.monotonic()
        if self.capacity is not None:
            self.capacity.routed.done(tracked.request_id)
        if tracked.first_token_at is not None and reason != "abort" and self.capacity is not None:
            self.capacity.times.observe(tracked.first_token_at - tracked.submitted_at, now - tracked.first_token_at)
        if tracked.session is not None and reason != "abort":
            self.homes.turn_finished(tracked.session.key, worker.worker_id, tracked.token_ids + tracked.output_ids,
                                     tracked.session.ttl_s, now)

    def _check_liveness(self) -> None:
        for worker in self.workers:
            if worker.alive and not worker.process.is_alive():
                self._worker_died(worker)

    def _worker_died(self, worker: WorkerHandle) -> None:
        if not worker.alive:
            return
        worker.alive = False
        worker.drop_outbox()
        self.dead_workers.append(worker.worker_id)
        self.homes.forget_worker(worker.worker_id)
        log.error("engine worker %d (pid %s) died; re-running its requests", worker.worker_id, worker.pid)
        self.pool.forget(worker.worker_id)
        if not self.stopping:
            self.pool.restart(worker)
        for tracked in list(self.tracked.values()):
            waiting_decode = any(w.pending_decode.get(tracked.attempt_id) == worker.worker_id for w in self.workers)
            if worker.worker_id in tracked.worker_ids or waiting_decode:
                self._rerun(tracked)

    def _rerun(self, tracked: Tracked) -> None:
        self.by_attempt.pop(tracked.attempt_id, None)
        tracked.attempt += 1
        tracked.skip, tracked.skip_chars = len(tracked.output_ids), tracked.emitted_chars
        self._dispatch(tracked)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[Completion]:
        return run_to_completion(self, prompts, params)

    def shutdown(self, deadline_s: float = 10.0) -> list[m.KVCounters]:
        """Stop every worker within the deadline; their KV transfer counters."""
        self.stopping = True
        self._wake_r.close()
        self._wake_w.close()
        return self.pool.stop(deadline_s)


def colocated_engine(model: str, settings: EngineSettings | None = None) -> WorkerEngine:
    """The colocated engine as a worker process: one worker that prefills and decodes everything, no capacity
    controller; a killed one is started again and its requests re-run."""
    settings = settings or EngineSettings()
    return WorkerEngine(model, settings, DeploymentSettings.colocated(settings.num_threads))
