"""A simulated engine worker: the engine's own `Scheduler` (queue policy, `KVCacheManager` with prefix
caching, session pins) stepped on simulated time, each step lasting what the step timer says.

A worker in the prefill role stops a request at its first token ("prefilled", as `LLMEngine` does), keeps its
blocks until the KV has crossed the link, and hands the request to its decode worker; a decode worker takes a
handed-off request as running when its KV fits (`engine.workers.worker.handoff.accept_handoff`), else recomputes it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from agents_eval.sim.model.cost import StepTimer, StepWork
from agents_eval.sim.model.records import RequestRecord, RoleChange, RunLog
from agents_eval.sim.model.tokens import SimSequence, TokenIds
from engine.capacity.signals import WorkerLoad
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.stats import StepTimer as StepRates
from engine.kv_cache.manager import HeldBlocks

Handoff = Callable[["SimWorker", SimSequence, RequestRecord, HeldBlocks], None]


@dataclass
class Host:
    """The machine workers share: how many of them are mid-step (a calibrated cluster's workers all run on the
    host its calibration describes; a roofline worker has a host of its own)."""

    stepping: int = 0


@dataclass
class Gpus:
    """What the worker runs on: its device kind and how many (its tensor-parallel group)."""

    device: str
    count: int


class SimWorker:
    def __init__(self, env: simpy.Environment, worker_id: int, role: str, scheduler: Scheduler,
                 timer: StepTimer, gpus: Gpus, tokens: TokenIds, log: RunLog, host: Host | None = None,
                 switch_s: float = 0.0) -> None:
        self.env, self.worker_id, self.role, self.switch_s = env, worker_id, role, switch_s
        self._switching = False  # a role change waits for the current step, then takes switch_s
        self.host = host or Host()
        self.scheduler, self.timer, self.gpus, self.tokens, self.log = scheduler, timer, gpus, tokens, log
        self.last_switch_at: float | None = None
        self.records: dict[str, RequestRecord] = {}
        self.on_prefilled: Handoff | None = None
        self._incoming = 0  # requests routed here whose KV is still on the link
        self._load: WorkerLoad | None = None  # cached until the worker's state changes
        self.busy_s = 0.0
        self.rates = StepRates()  # the engine's own averages of its step times, as a real worker reports them
        # when it last ran out of work (None: working); a run starts warm, as the real runs after their warm-up
        self._idle_since: float | None = env.now
        self._wake = env.event()
        env.process(self._run())

    @property
    def decode_step_s(self) -> float | None:
        return self.rates.decode_step_s or None

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.rates.prefill_tokens_per_s or None

    @property
    def incoming(self) -> int:
        return self._incoming

    @incoming.setter
    def incoming(self, count: int) -> None:
        self._incoming, self._load = count, None

    def submit(self, seq: SimSequence, record: RequestRecord) -> None:
        self.records[seq.request_id] = record
        self.scheduler.add(seq)
        self.notify()

    def accept(self, seq: SimSequence, record: RequestRecord) -> None:
        """A prefilled request with its KV: running at once when its blocks fit, else recomputed here."""
        self.records[seq.request_id] = record
        kv = self.scheduler.kv
        if kv.allocate_slots(seq.request_id, seq.all_token_ids, 0, seq.num_prompt_tokens) is not None:
            seq.num_computed_tokens = seq.num_prompt_tokens
            self.scheduler.add_running(seq)
        else:
            self.scheduler.add(seq)
        self.notify()

    def set_role(self, role: str) -> None:
        """New work is routed by the new role at once; the worker serves in it after its current step and
        `switch_s` (its KV receivers opened), as the coordinator's `set_role` and the worker's `RoleChanged`."""
        self.role, self.last_switch_at, self._load, self._switching = role, self.env.now, None, True
        self.notify()

    def _switch(self) -> Generator[simpy.Event, Any, None]:
        self._switching = False
        if self.switch_s:
            yield self.env.timeout(self.switch_s)
        self.log.roles_applied.append(RoleChange(self.env.now, self.worker_id, self.role))

    def load(self) -> WorkerLoad:
        if self._load is None:
            self._load = self._measure_load()
        return self._load

    def _measure_load(self) -> WorkerLoad:
        sched = self.scheduler
        waiting = sum(s.num_uncomputed_tokens for s in sched.waiting)
        waiting += sum(s.num_uncomputed_tokens for s in sched.running if s.num_uncomputed_tokens > 1)
        streams = sum(1 for s in sched.running if s.num_uncomputed_tokens <= 1)
        return WorkerLoad(self.worker_id, self.role, len(sched.running) + len(sched.waiting) + self.incoming,
                          waiting, streams, self.last_switch_at, self.prefill_tokens_per_s,
                          self.rates.prefill_stall_tokens_per_s or None, sched.kv.usage)

    def notify(self) -> None:
        self._load = None
        if not self._wake.triggered:
            self._wake.succeed()

    def _run(self) -> Generator[simpy.Event, Any, None]:  # a simpy process
        while True:
            if self._switching:
                yield from self._switch()
            batch = self.scheduler.schedule(self.env.now) if self.scheduler.has_unfinished() else ScheduledBatch()
            self._load = None
            if not batch.seqs:
                if self._idle_since is None:
                    self._idle_since = self.env.now
                self._wake = self.env.event()
                yield self._wake
                continue
            composition = batch.composition()
            samples = [hit for _, _, hit in composition]
            work = StepWork.of(composition)
            seconds = self.timer.step_time(work) + self._after_idle_s()
            if self.host.stepping:
                seconds *= self.timer.co_run_factor(work)
            self.host.stepping += 1
            yield self.env.timeout(seconds)
            self.host.stepping -= 1
            self._account(batch, seconds)
            sampled = {s.request_id: self.tokens.one() for s, hit in zip(batch.seqs, samples, strict=True) if hit}
            self.scheduler.update(batch, sampled)
            self._load = None
            for seq, hit in zip(batch.seqs, samples, strict=True):
                if hit:
                    self._token(seq)  # type: ignore[arg-type]

    def _after_idle_s(self) -> float:
        if self._idle_since is None:
            return 0.0
        idle_s, self._idle_since = self.env.now - self._idle_since, None
        return self.timer.after_idle_s(idle_s)

    def _account(self, batch: ScheduledBatch, seconds: float) -> None:
        self.busy_s += seconds
        self.log.steps += 1
        self.rates.observe(seconds, batch.prompt_tokens, batch.decode_streams)
        for seq, new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq.num_computed_tokens < seq.num_prompt_tokens:  # before update(): a prompt step
                prompt_left = seq.num_prompt_tokens - seq.num_computed_tokens
                self.records[seq.request_id].computed_prompt_tokens += min(new, prompt_left)

    def _token(self, seq: SimSequence) -> None:
        record, now = self.records[seq.request_id], self.env.now
        if record.first_token_s is None:
            record.first_token_s = now
        record.last_token_s, record.tokens = now, record.tokens + 1
        if record.token_times is not None:
            record.token_times.append(now)
        if seq.prefill_only:
            self._prefilled(seq, record)
        elif record.tokens >= record.output_tokens:
            record.output_ids = list(seq.output_token_ids)
            self.scheduler.finish(seq, "length", now)
            del self.records[seq.request_id]
            record.done.succeed()

    def _prefilled(self, seq: SimSequence, record: RequestRecord) -> None:
        held = self.scheduler.kv.detach(seq.request_id)
        self.scheduler.finish(seq, "prefilled", self.env.now)
        del self.records[seq.request_id]
        assert self.on_prefilled is not None, "a prefill worker needs a hand-off target"
        self.on_prefilled(self, seq, record, held)
