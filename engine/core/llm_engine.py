"""The colocated engine: one worker doing prefill and decode. `step()` schedules, runs, and reports."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from engine.config import EngineSettings
from engine.core.output import OutputProcessor, RequestOutput
from engine.core.queue_policy import make_queue_policy
from engine.core.sampling.constraint import GrammarCounters
from engine.core.sampling.grammar import Grammars, grammar_tokenizer
from engine.core.sampling.sampler import RequestError, SamplingParams, TokenLogprob
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence, SessionRef
from engine.core.slo import SloConfig, load_slo_config
from engine.core.stats import AgentSignals, EngineStats, StepTimer, WorkerReport, queue_stats
from engine.core.step_trace import StepTrace
from engine.core.validation import Prompt, RequestValidator, load_tokenizer_or_none, num_kv_blocks
from engine.kv_cache.manager import HeldBlocks, KVCacheManager
from engine.kv_cache.policy import make_policy
from engine.kv_cache.sizing import sized_settings
from engine.kv_cache.tiers.engine import TierHooks, make_tier_hooks
from engine.model.loader import load_model
from engine.model.mask import MaskedSpan, QuerySelection
from engine.model.runner import ModelRunner, forced_room

if TYPE_CHECKING:
    from engine.capacity.loop import CapacityLoop


@dataclass
class Completion:
    """A finished request, accumulated from its outputs."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    logits: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def add(self, out: RequestOutput) -> None:
        self.token_ids += out.new_token_ids
        self.text += out.new_text
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.finish_reason = out.finish_reason
        self.logits += out.logits
        self.logprobs += out.logprobs


@dataclass
class Prefilled:
    """A prefill-only request's KV and sampling state, kept until handed off and released."""

    seq: Sequence
    blocks: HeldBlocks
    sampler_state: torch.Tensor


class LLMEngine:
    steps_when_idle = False  # nothing happens here between requests

    def __init__(self, model: str, settings: EngineSettings | None = None, slo: SloConfig | None = None) -> None:
        self.settings = settings = settings or EngineSettings()
        if settings.num_threads:
            torch.set_num_threads(settings.num_threads)
        dtype = getattr(torch, settings.dtype)
        loaded = load_model(model, dtype, settings.device, settings.gguf_weights)
        self.config = loaded.config
        self.checkpoint = loaded.checkpoint
        self.tokenizer = load_tokenizer_or_none(loaded.checkpoint)
        self.max_model_len = self.config.max_position_embeddings
        self.settings = settings = sized_settings(self.config, settings, model)
        self.num_blocks = num_kv_blocks(self.config, settings)
        self.slo = slo or load_slo_config()
        self.validator = RequestValidator(self.config, self.tokenizer, settings.block_size, self.num_blocks,
                                          frozenset(self.slo.classes))
        kv_settings = settings.kv_cache
        policy = (make_policy(kv_settings.eviction, kv_settings.weights, self.num_blocks)
                  if kv_settings.eviction != "lru" else None)  # None: the pool's LRU free queue
        self.kv = KVCacheManager(self.num_blocks, settings.block_size, settings.enable_prefix_caching, policy)
        self.scheduler = Scheduler(self.kv, settings.max_num_batched_tokens, settings.max_num_seqs,
                                   policy=make_queue_policy(settings.queue_policy, self.slo))
        self.runner = ModelRunner(loaded.model, self.config, self.num_blocks, settings.block_size, dtype,
                                  settings.device)
        self.tiers: TierHooks | None = make_tier_hooks(kv_settings, self.runner, self._identity(model),
                                                       lambda: self.step_timer.prefill_tokens_per_s)
        if self.tiers is not None:
            self.kv.set_tiers(self.tiers.tiers)
        eos = self.config.eos_token_ids or _tuple(self.tokenizer.eos_token_id if self.tokenizer else None)
        self.outputs = OutputProcessor(self.tokenizer or _NoText(), eos, self.max_model_len,
                                       settings.stream_interval)
        self._eos_token_ids = eos
        self._seqs: dict[str, Sequence] = {}
        self.prefilled: dict[str, Prefilled] = {}  # prefill-only requests whose KV awaits hand-off
        self._next_id = itertools.count()
        self.step_timer = StepTimer()
        self.trace = StepTrace(settings.step_trace_dir) if settings.step_trace_dir else None
        self.capacity: CapacityLoop | None = None  # one worker does both jobs: no capacity controller

    def _identity(self, model: str) -> dict[str, object]:
        """What makes this engine's KV differ from another's: the stores' namespace (engine.kv_cache.keys)."""
        return {"model": str(self.checkpoint or model), "config": self.config, "dtype": self.settings.dtype,
                "block_size": self.settings.block_size}

    def tokenize(self, prompt: Prompt) -> list[int]:
        return self.validator.tokenize(prompt)

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """Token ids of a valid request; RequestError naming the problem otherwise."""
        return self.validator.validate(prompt, params)

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
                    masked_spans: Seq[MaskedSpan] = (), session: SessionRef | None = None,
                    prefill_only: bool = False, selection: QuerySelection | None = None) -> str:
        """Queue a request. masked_spans: history the request's attention skips; selection: the history
        blocks its decode steps read are picked by its queries (the `query` policy); session: the agent
        session it is a turn of, whose KV stays pinned after it for session.ttl_s seconds; prefill_only:
        stop after the first token with finish reason "prefilled", keeping the KV for `take_prefilled`."""
        token_ids = self.validate(prompt, params)
        request_id = request_id or f"req-{next(self._next_id)}"
        if any(span.end > len(token_ids) for span in masked_spans):
            raise RequestError(f"a masked span ends past the prompt's {len(token_ids)} tokens")
        seq = Sequence(request_id, token_ids, params, masked_spans=tuple(masked_spans), session=session,
                       prefill_only=prefill_only, selection=selection)
        self.admit(seq)
        return request_id

    def admit(self, seq: Sequence, sampler_state: torch.Tensor | None = None, running: bool = False) -> None:
        """Take a sequence in; running=True when its KV is already in its blocks (a hand-off)."""
        if seq.request_id in self._seqs:
            raise RequestError(f"request id {seq.request_id!r} is already running")
        if seq.params.grammar is not None:
            room = forced_room(seq, self.max_model_len)
            seq.output_token_ids += self.grammars().add(seq.request_id, seq.params.grammar, seq.output_token_ids,
                                                        room)
        self._seqs[seq.request_id] = seq
        self.runner.sampler.add_request(seq.request_id, seq.params.seed)
        if sampler_state is not None:
            self.runner.sampler.set_state(seq.request_id, sampler_state)
        if running:
            self.scheduler.add_running(seq)
        else:
            self.scheduler.add(seq)

    def grammars(self) -> Grammars:
        """The engine's structured-output state, made at the first constrained request (its tokenizer view takes
        about a second to build for a 49k vocabulary)."""
        if self.runner.grammars is None:
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer: structured outputs need one")
            tokenizer = grammar_tokenizer(self.tokenizer, self.config.vocab_size, self._eos_token_ids)
            self.runner.grammars = Grammars(tokenizer, self.config.vocab_size)
        return self.runner.grammars

    def grammar_counters(self) -> GrammarCounters:
        return replace(self.runner.grammars.counters) if self.runner.grammars is not None else GrammarCounters()

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        self._finish(seq, "abort")
        return self.outputs.make_output(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, on_layer: Callable[[ScheduledBatch, int], None] | None = None) -> list[RequestOutput]:
        """One scheduling step; on_layer(batch, layer) runs after each layer (layer-wise KV streaming)."""
        started = time.monotonic()
        started_cpu = time.thread_time() if self.trace is not None else 0.0  # a system call: only when traced
        if self.tiers is not None:
            self.tiers.promote_due(self.kv, started)
        batch = self.scheduler.schedule(started)
        if not batch.seqs:
            return self._finish_unschedulable()
        block_tables = [self.kv.block_ids(s.request_id) for s in batch.seqs]
        layer_done = None if on_layer is None else functools.partial(on_layer, batch)
        result = self.runner.execute(batch, block_tables, layer_done)
        self.step_timer.observe(time.monotonic() - started, batch.prompt_tokens, batch.decode_streams)
        traced = None if self.trace is None else batch.composition()  # before update() counts it computed
        self.scheduler.update(batch, result.sampled, result.forced)
        outputs = []
        for seq in batch.seqs:
            if seq.request_id in result.sampled:
                reason = self.outputs.check_stop(seq) or ("prefilled" if seq.prefill_only else None)
                if reason is not None:
                    self._finish(seq, reason)
                rid = seq.request_id
                logits = [result.logits[rid]] if rid in result.logits else []
                logprobs = [result.logprobs[rid]] if rid in result.logprobs else []
                out = self.outputs.make_output(seq, logits, logprobs)
                if out is not None:
                    outputs.append(out)
        if self.trace is not None and traced is not None:
            self.trace.record(started, time.monotonic() - started, traced, time.thread_time() - started_cpu)
        return outputs

    def _finish_unschedulable(self) -> list[RequestOutput]:
        """Nothing fits although nothing runs: the head request outgrew the whole cache alone."""
        if self.scheduler.running or not self.scheduler.waiting or self.scheduler.waiting[0].num_preemptions == 0:
            return []
        seq = self.scheduler.waiting[0]
        self._finish(seq, "length")
        out = self.outputs.make_output(seq)  # finished: never held
        return [out] if out is not None else []

    def _finish(self, seq: Sequence, reason: str) -> None:
        if reason == "prefilled":
            state = self.runner.sampler.get_state(seq.request_id)
            self.prefilled[seq.request_id] = Prefilled(seq, self.kv.detach(seq.request_id), state)
        self.scheduler.finish(seq, reason, time.monotonic())
        if self.tiers is not None and seq.session is not None and reason != "abort":
            self._persist_turn(self.tiers, seq.session.key)
        self.runner.sampler.remove_request(seq.request_id)
        self.runner.release(seq.request_id)
        del self._seqs[seq.request_id]

    def _persist_turn(self, tiers: TierHooks, key: str) -> None:
        """A session's finished turn, now pinned: its full blocks go through to the persistent tier."""
        pin = self.scheduler.pins.pins.get(key)
        if pin is not None:
            tiers.turn_finished(key, pin.held)

    def set_session_ttl(self, key: str, ttl_s: float) -> bool:
        """Re-time the KV pin of a session's last turn (False when it holds none); with lower KV tiers, its
        KV is also promoted back to the device shortly before the tool result is due (a share of the TTL)."""
        now = time.monotonic()
        if self.tiers is not None:
            self.tiers.prefetch.schedule(key, now + ttl_s * self.settings.kv_cache.prefetch_ttl_share)
        return self.scheduler.pins.set_ttl(key, ttl_s, now)

    def kv_tier_stats(self) -> dict[str, Any] | None:
        """Per-tier counters of the KV hierarchy (engine.kv_cache.tiers.engine.TierHooks.stats); None: no tiers."""
        return self.tiers.stats() if self.tiers is not None else None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while a request holds blocks."""
        return self.kv.reset_prefix_cache()

    def expire_pins(self) -> int:
        """Release the session pins whose time is up now, as a step would (an idle engine takes no step)."""
        return self.scheduler.pins.expire(time.monotonic())

    def worker_reports(self) -> list[WorkerReport]:
        return []  # this process is the engine: its load is the engine's

    def stats(self) -> EngineStats:
        queues = queue_stats(list(self.scheduler.running), list(self.scheduler.waiting), time.monotonic())
        return replace(queues, kv_usage=self.kv.usage, kv_blocks_free=self.kv.num_free_blocks,
                       prefix_cache_queries=self.kv.stats.queries, prefix_cache_hits=self.kv.stats.hits,
                       decode_step_s=self.step_timer.decode_step_s,
                       prefill_tokens_per_s=self.step_timer.prefill_tokens_per_s,
                       prefill_stall_tokens_per_s=self.step_timer.prefill_stall_tokens_per_s,
                       decode_line=self.step_timer.decode_line.line(), workers={"colocated": 1},
                       grammar=self.grammar_counters(), history=self.runner.history.copy())

    def wakeup(self) -> None:
        """Nothing to do: a colocated step never blocks waiting for events."""

    def shutdown(self, deadline_s: float = 10.0) -> None:
        """Nothing to stop (the engine lives in this process); the device's cached KV is written through to
        the persistent tier, so a restarted engine continues its sessions."""
        if self.trace is not None:
            self.trace.close()
        if self.tiers is not None:
            self.tiers.flush(self.kv)
            self.tiers.close()

    def update_signals(self, signals: AgentSignals) -> None:
        """Nothing to steer: one worker does both jobs."""

    def get_sampling_state(self, request_id: str) -> torch.Tensor:
        return self.runner.sampler.get_state(request_id)

    def set_sampling_state(self, request_id: str, state: torch.Tensor) -> None:
        self.runner.sampler.set_state(request_id, state)

    def generate(self, prompts: Seq[Prompt], params: SamplingParams | Seq[SamplingParams]) -> list[Completion]:
        """Run prompts to completion; results in prompt order."""
        return run_to_completion(self, prompts, params)


class SteppedEngine(Protocol):
    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]: ...
    def add_request(self, prompt: Prompt, params: SamplingParams) -> str: ...
    def has_unfinished(self) -> bool: ...
    def step(self) -> list[RequestOutput]: ...


def run_to_completion(engine: SteppedEngine, prompts: Seq[Prompt],
                      params: SamplingParams | Seq[SamplingParams]) -> list[Completion]:
    """Validate every prompt first (nothing is queued if one is bad), then step until all are done."""
    all_params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    for prompt, sp in zip(prompts, all_params, strict=True):
        engine.validate(prompt, sp)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, all_params, strict=True)]
    results = {i: Completion(i) for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            results[out.request_id].add(out)
    return [results[i] for i in ids]


def _tuple(token_id: int | None) -> tuple[int, ...]:
    return () if token_id is None else (token_id,)


class _NoText:
    def decode(self, ids: list[int]) -> str:
        return ""
