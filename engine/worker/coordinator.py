"""The disaggregated engine as the serving process sees it: starts the worker processes, routes each
request to a prefill worker (which streams the KV to a decode worker) and relays outputs. Same
add_request / step / abort / generate surface as the colocated `LLMEngine`.

A worker that dies is detected (its pipe closes or its process ends); its requests are re-run on the
remaining workers from their token ids, skipping the tokens already streamed (identical for greedy and
for seeded sampling)."""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait

from engine.config import EngineSettings
from engine.llm_engine import Completion, run_to_completion
from engine.output import RequestOutput
from engine.requests import Prompt, RequestValidator, load_tokenizer_or_none, num_kv_blocks, read_model_config
from engine.sampling import SamplingParams
from engine.worker import messages as m
from engine.worker.deployment import DeploymentSettings
from engine.worker.handles import WorkerHandle, start_workers, stop_workers

log = logging.getLogger(__name__)


@dataclass
class Tracked:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    worker_ids: set[int] = field(default_factory=set)
    emitted: int = 0  # output tokens already given to the caller
    emitted_chars: int = 0
    skip: int = 0  # tokens a re-run regenerates that the caller already has
    skip_chars: int = 0
    attempt: int = 0

    @property
    def attempt_id(self) -> str:
        return self.request_id if self.attempt == 0 else f"{self.request_id}#retry{self.attempt}"


@dataclass
class TransferLog:
    requests: int = 0
    bytes: int = 0
    send_seconds: float = 0.0
    exposed_seconds: float = 0.0

    @property
    def hidden_fraction(self) -> float:
        """Share of KV sending that overlapped the prefill's own compute."""
        return 1.0 - self.exposed_seconds / self.send_seconds if self.send_seconds else 0.0


class DisaggregatedEngine:
    def __init__(self, model: str, settings: EngineSettings | None = None,
                 deployment: DeploymentSettings | None = None) -> None:
        self.settings = settings or EngineSettings()
        self.deployment = deployment or DeploymentSettings()
        config, checkpoint_dir = read_model_config(model)
        self.tokenizer = load_tokenizer_or_none(checkpoint_dir)
        self.validator = RequestValidator(config, self.tokenizer, self.settings.block_size,
                                          num_kv_blocks(config, self.settings))
        self.workers = start_workers(mp.get_context("spawn"), model, self.settings, self.deployment)
        self.tracked: dict[str, Tracked] = {}
        self.by_attempt: dict[str, Tracked] = {}
        self.transfers = TransferLog()
        self.role_switches: list[float] = []  # seconds from SetRole to applied, offset-corrected
        self.dead_workers: list[int] = []
        self._ids = itertools.count()
        self._counters: dict[int, m.KVCounters] = {}

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None) -> str:
        token_ids = self.validate(prompt, params)
        request_id = request_id or f"req-{next(self._ids)}"
        tracked = Tracked(request_id, token_ids, params)
        self.tracked[request_id] = tracked
        self._dispatch(tracked)
        return request_id

    def _dispatch(self, tracked: Tracked) -> None:
        self.by_attempt[tracked.attempt_id] = tracked
        prefill, decode = self._pick(m.PREFILL), self._pick(m.DECODE)
        if prefill is None or decode is None or prefill is decode:
            target = prefill or decode or self._any_alive()
            target.send(m.Submit(tracked.attempt_id, tracked.token_ids, tracked.params))
            tracked.worker_ids = {target.worker_id}
            return
        prefill.send(m.Submit(tracked.attempt_id, tracked.token_ids, tracked.params,
                              decode_address=decode.kv_address))
        tracked.worker_ids = {prefill.worker_id}
        prefill.pending_decode[tracked.attempt_id] = decode.worker_id

    def _pick(self, role: str) -> WorkerHandle | None:
        candidates = [w for w in self.workers if w.alive and w.role == role]
        return min(candidates, key=self._load) if candidates else None

    def _load(self, worker: WorkerHandle) -> int:
        return sum(worker.worker_id in t.worker_ids for t in self.tracked.values())

    def _any_alive(self) -> WorkerHandle:
        alive = [w for w in self.workers if w.alive]
        if not alive:
            raise RuntimeError("every engine worker has died")
        return alive[0]

    def abort(self, request_id: str) -> None:
        tracked = self.tracked.pop(request_id, None)
        if tracked is not None:
            for worker in self.workers:
                if worker.worker_id in tracked.worker_ids and worker.alive:
                    worker.send(m.Abort(tracked.attempt_id))

    def has_unfinished(self) -> bool:
        return bool(self.tracked)

    def step(self, timeout_s: float = 0.05) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        ready = wait([w.conn for w in self.workers if w.alive], timeout_s)
        for worker in self.workers:
            if worker.conn in ready:
                outputs += self._drain(worker)
        self._check_liveness()
        return outputs

    def _drain(self, worker: WorkerHandle) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        try:
            while worker.conn.poll():
                outputs += self._on_event(worker, worker.conn.recv())
        except (EOFError, OSError):
            self._worker_died(worker)
        return outputs

    def _on_event(self, worker: WorkerHandle, event: m.Event) -> list[RequestOutput]:
        if isinstance(event, m.Outputs):
            return [out for raw in event.outputs if (out := self._relay(raw)) is not None]
        if isinstance(event, m.Prefilled):
            self._forward_handoff(worker, event)
        elif isinstance(event, m.Counters):
            self._counters[event.worker_id] = event.counters
        elif isinstance(event, m.RoleChanged):
            applied = event.applied_at - worker.clock_offset_s
            self.role_switches.append(max(0.0, applied - event.sent_at))
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
        if not decode.alive:
            self._rerun(tracked)
            return
        decode.send(m.AcceptHandoff(event.handoff))
        tracked.worker_ids = {decode.worker_id}

    def _relay(self, raw: RequestOutput) -> RequestOutput | None:
        tracked = self.by_attempt.get(raw.request_id)
        if tracked is None or tracked.request_id not in self.tracked:
            return None
        new_tokens = raw.new_token_ids[tracked.skip:]
        tracked.skip = max(0, tracked.skip - len(raw.new_token_ids))
        text = raw.new_text[tracked.skip_chars:]
        tracked.skip_chars = max(0, tracked.skip_chars - len(raw.new_text))
        tracked.emitted += len(new_tokens)
        tracked.emitted_chars += len(text)
        finished = raw.finished and raw.finish_reason != "prefilled"
        if finished:
            del self.tracked[tracked.request_id]
            self.by_attempt.pop(raw.request_id, None)
        return replace(raw, request_id=tracked.request_id, new_token_ids=new_tokens, new_text=text,
                       finished=finished, finish_reason=raw.finish_reason if finished else None)

    def _check_liveness(self) -> None:
        for worker in self.workers:
            if worker.alive and not worker.process.is_alive():
                self._worker_died(worker)

    def _worker_died(self, worker: WorkerHandle) -> None:
        if not worker.alive:
            return
        worker.alive = False
        self.dead_workers.append(worker.worker_id)
        log.error("engine worker %d (pid %s) died; re-running its requests", worker.worker_id, worker.process.pid)
        for tracked in list(self.tracked.values()):
            waiting_decode = any(w.pending_decode.get(tracked.attempt_id) == worker.worker_id for w in self.workers)
            if worker.worker_id in tracked.worker_ids or waiting_decode:
                self._rerun(tracked)

    def _rerun(self, tracked: Tracked) -> None:
        self.by_attempt.pop(tracked.attempt_id, None)
        tracked.attempt += 1
        tracked.skip, tracked.skip_chars = tracked.emitted, tracked.emitted_chars
        self._dispatch(tracked)

    def inject_kv_fault(self, fault: str | None) -> None:
        """Failure testing only: make every prefill worker damage its KV transfers (None: stop)."""
        for worker in self.workers:
            if worker.alive:
                worker.send(m.InjectKVFault(fault))

    def kv_counters(self, timeout_s: float = 10.0) -> dict[int, m.KVCounters]:
        """Each live worker's KV receive counters (asked between their steps)."""
        for worker in self.workers:
            if worker.alive:
                worker.send(m.CountersQuery())
        self._counters.clear()
        deadline = time.monotonic() + timeout_s
        while len(self._counters) < sum(w.alive for w in self.workers) and time.monotonic() < deadline:
            self.step()
        return dict(self._counters)

    def set_role(self, worker_id: int, role: str) -> None:
        worker = self.workers[worker_id]
        worker.role = role
        worker.send(m.SetRole(role, time.time()))

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        return self.validator.validate(prompt, params)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[Completion]:
        return run_to_completion(self, prompts, params)

    def shutdown(self, deadline_s: float = 10.0) -> list[m.KVCounters]:
        """Stop every worker within the deadline; their KV transfer counters."""
        return stop_workers(self.workers, deadline_s)
