"""The simulated gateway: plays each agent session's turns, routes each turn with the engine's KV-aware router
(`engine.capacity.routing.place`, conditional disaggregation included) and carries prefilled KV over the
links. A session's home (the worker holding its last turn) is tracked as
`engine.workers.coordinator.session_homes` does,
comparing lengths instead of token lists: a simulated session's history is append-only by construction."""

from __future__ import annotations

import itertools
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from agents_eval.sim.blocks import Prompt
from agents_eval.sim.cluster import Cluster
from agents_eval.sim.records import RequestRecord
from agents_eval.sim.tokens import SimSequence
from agents_eval.sim.worker import SimWorker
from agents_eval.sim.workload import SimSession
from agents_eval.workloads.types import APPEND
from engine.capacity.routing import Turn, place
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import AdmittedWork, RoutedPrefills, RoutedWork
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef
from engine.kv_cache.manager import HeldBlocks
from predictor.records import TurnRecord


@dataclass
class Home:
    worker_id: int
    tokens: int  # leading tokens of the session's history that worker holds


@dataclass
class Gateway:
    cluster: Cluster
    settings: CapacitySettings
    forecaster: Any = None  # predictor.forecast.LoadForecaster, when the config asks for it
    homes: dict[str, Home] = field(default_factory=dict)
    live: set[RequestRecord] = field(default_factory=set)
    prefills: RoutedPrefills = field(default_factory=RoutedPrefills)  # the coordinator's account, kept the same way
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        for worker in self.cluster.workers:
            worker.on_prefilled = self._hand_off

    def admitted(self) -> AdmittedWork:
        prompts = [r for r in self.live if r.first_token_s is None]
        return AdmittedWork(sum(r.uncached_tokens for r in prompts), sum(r.output_tokens - r.tokens for r in self.live),
                            len(self.live), len(prompts))

    def routed(self) -> RoutedWork | None:
        """The router's split of the placed prompts not yet past their first token, as the coordinator reports it:
        the prompts a worker gave a first token since the last look are done."""
        for record in self.live:
            if record.first_token_s is not None:
                self.prefills.done(record.request_id)
        return self.prefills.work()

    def play(self, session: SimSession, system: list[int]) -> Generator[simpy.Event, Any, None]:
        env, tokens = self.cluster.env, self.cluster.tokens
        yield env.timeout(session.start_s)
        # a prompt is what the session keeps (all its history, or the system prompt), the previous reply and
        # the turn's new tokens
        kept, previous = Prompt(self.cluster.config.engine.block_size, system), list[int]()
        for turn in session.turns:
            if turn.gap_s:
                yield env.timeout(turn.gap_s)
            prompt = kept.then(previous, tokens.fresh(turn.new_tokens))
            record = self.serve(session.session_id, prompt, turn.output_tokens, turn.gap_s, turn.phase)
            yield record.done
            previous = record.output_ids
            if session.history == APPEND:
                kept = prompt

    def serve(self, session_id: str, prompt: list[int], output_tokens: int, gap_s: float = 0.0,
              phase: str = "think") -> RequestRecord:
        env, config = self.cluster.env, self.cluster.config
        home = self.homes.get(session_id)
        cached = {home.worker_id: home.tokens - home.tokens % config.engine.block_size} if home else {}
        turn = Turn(len(prompt), session_id, cached)
        placement = place(turn, [w.load() for w in self.cluster.workers], self.settings, config.engine.block_size)
        record = RequestRecord(f"req-{next(self._ids)}", session_id, env.now, len(prompt), output_tokens,
                               turn.uncached_on(placement.decode_worker), env.event(), placement.decode_worker,
                               placement.prefill_worker)
        self.prefills.placed(record.request_id, placement.uncached_tokens, placement.for_prefill_worker)
        self._observe(record, gap_s, phase)
        params = SamplingParams(max_tokens=output_tokens, ignore_eos=True, slo_class=config.slo_class)
        session = SessionRef(session_id, config.session_ttl_s) if config.session_ttl_s else None
        if placement.prefill_worker is None:
            seq = SimSequence(record.request_id, prompt, params, arrival_time=env.now, session=session)
            self._dispatch(self.cluster.by_id(placement.decode_worker), seq, record)
        else:
            seq = SimSequence(record.request_id, prompt, params, arrival_time=env.now, prefill_only=True)
            self.cluster.by_id(placement.decode_worker).incoming += 1
            self._dispatch(self.cluster.by_id(placement.prefill_worker), seq, record)
        self.live.add(record)
        record.done.callbacks.append(lambda _: self._finished(record))
        return record

    def _dispatch(self, worker: SimWorker, seq: SimSequence, record: RequestRecord) -> None:
        if not self.cluster.dispatch_s:
            worker.submit(seq, record)
            return
        worker.incoming += 1  # counted on its worker while on its way, as the coordinator counts it
        self.cluster.env.process(self._after_hop(worker, seq, record))

    def _after_hop(self, worker: SimWorker, seq: SimSequence, record: RequestRecord
                   ) -> Generator[simpy.Event, Any, None]:
        yield self.cluster.env.timeout(self.cluster.dispatch_s)
        worker.incoming -= 1
        worker.submit(seq, record)

    def _observe(self, record: RequestRecord, gap_s: float, phase: str) -> None:
        if self.forecaster is not None:
            cached = record.prompt_tokens - record.uncached_tokens
            self.forecaster.observe(record.session_id, TurnRecord(record.uncached_tokens, record.prompt_tokens,
                                                                   cached, record.output_tokens, gap_s,
                                                                   "think" if phase == "think" else "act"),
                                    record.arrival_s)

    def _finished(self, record: RequestRecord) -> None:
        self.live.discard(record)
        self.prefills.done(record.request_id)
        self.cluster.log.requests.append(record)
        self.homes[record.session_id] = Home(record.decode_worker, record.prompt_tokens + record.tokens)

    def _hand_off(self, prefill: SimWorker, seq: SimSequence, record: RequestRecord, held: HeldBlocks) -> None:
        decode = self.cluster.by_id(record.decode_worker)
        if record.tokens >= record.output_tokens:  # a one-token reply ends at the prefill worker
            prefill.scheduler.kv.release(held)
            decode.incoming -= 1
            record.output_ids = list(seq.output_token_ids)
            record.done.succeed()
            return
        self.cluster.env.process(self._transfer(prefill, decode, seq, record, held))

    def _transfer(self, prefill: SimWorker, decode: SimWorker, seq: SimSequence, record: RequestRecord,
                  held: HeldBlocks) -> Generator[simpy.Event, Any, None]:
        env, config = self.cluster.env, self.cluster.config
        link, nic = self.cluster.links[prefill.worker_id]
        started = env.now
        with nic.request() as turn:
            yield turn
            yield env.timeout(link.transfer_s(seq.num_prompt_tokens * self.cluster.shape.kv_bytes_per_token))
        record.kv_transfer_s = env.now - started
        prefill.scheduler.kv.release(held)
        prefill.notify()
        decode.incoming -= 1
        session = SessionRef(record.session_id, config.session_ttl_s) if config.session_ttl_s else None
        handed = SimSequence(seq.request_id, seq.prompt_token_ids, seq.params, list(seq.output_token_ids),
                             arrival_time=seq.arrival_time, session=session)
        decode.accept(handed, record)
