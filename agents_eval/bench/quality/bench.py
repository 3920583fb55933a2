"""Run every transcript under every variant through the engine, greedy, and score the answers.

Transcripts go in batches: first `full` and `pruned`, then the variants that share their prefixes
(`masked` shares full's tokens up to its first mask, `pruned+masked` pruned's), so the prefix cache
computes shared blocks once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from rich.progress import Progress

from agents_eval.bench.quality.answers import mentions
from agents_eval.bench.quality.scoring import Outcome, TranscriptResult
from agents_eval.bench.quality.transcripts import generate_transcripts
from agents_eval.bench.quality.variants import VARIANTS, VariantPrompt, build_prompt
from agents_eval.report import check_settings
from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.tokenizer import Tokenizer
from trajectory.agent import Policies
from trajectory.template.default import load_chat_template

PHASES = (("full", "pruned"), ("masked", "pruned+masked", "dropped"))
Advance = Callable[[int], None]


@dataclass(frozen=True)
class QualityBenchSettings:
    model: str = "smollm2"
    transcripts: int = 100
    seed: int = 0
    max_tokens: int = 24
    batch: int = 4  # transcripts per engine batch
    num_threads: int = 0  # 0: every core

    def validate(self) -> None:
        check_settings([
            (self.transcripts >= 1, "--transcripts must be at least 1"),
            (self.max_tokens >= 1, "--max-tokens must be at least 1"),
            (self.batch >= 1, "--batch must be at least 1"),
            (self.num_threads >= 0, "--threads must be at least 1 (0: every core)"),
        ])

    @property
    def threads(self) -> int:
        return self.num_threads or os.cpu_count() or 1


@dataclass
class Measured:
    results: list[TranscriptResult]
    engine: LLMEngine
    policies: Policies
    wall_s: float


def _tokenizer(engine: LLMEngine) -> Tokenizer:
    if engine.tokenizer is None:
        raise ValueError("the quality benchmark renders chat messages and needs a model with a tokenizer")
    return engine.tokenizer


def complete(engine: LLMEngine, prompts: Sequence[VariantPrompt], params: SamplingParams,
             advance: Advance) -> list[Completion]:
    ids = [engine.add_request(p.token_ids, params, masked_spans=p.masked_spans) for p in prompts]
    results = {request_id: Completion(request_id) for request_id in ids}
    while engine.has_unfinished():
        for out in engine.step():
            results[out.request_id].add(out)
            advance(1 if out.finished else 0)
    return [results[request_id] for request_id in ids]


def _run_batch(engine: LLMEngine, prompts: Sequence[dict[str, VariantPrompt]], params: SamplingParams,
               advance: Advance) -> list[dict[str, Completion]]:
    done: list[dict[str, Completion]] = [{} for _ in prompts]
    for variants in PHASES:
        jobs = [(i, v) for i in range(len(prompts)) for v in variants]
        for (i, variant), completion in zip(jobs, complete(engine, [prompts[i][v] for i, v in jobs], params,
                                                           advance), strict=True):
            done[i][variant] = completion
    return done


def _outcome(prompt: VariantPrompt, completion: Completion, answer: str) -> Outcome:
    return Outcome(completion.text, completion.token_ids, prompt.observation_tokens,
                   prompt.attended_observation_tokens, mentions(completion.text, answer),
                   completion.num_prompt_tokens, completion.num_cached_tokens)


def measure(settings: QualityBenchSettings, engine_settings: EngineSettings, progress: Progress) -> Measured:
    start = time.perf_counter()
    torch.set_num_threads(settings.threads)
    engine = LLMEngine(settings.model, engine_settings.model_copy(update={"num_threads": settings.threads}))
    template, tokenizer, policies = load_chat_template(engine.checkpoint), _tokenizer(engine), Policies.load()
    transcripts = generate_transcripts(settings.transcripts, settings.seed)
    prompts = [{v: build_prompt(t, v, template, tokenizer, policies) for v in VARIANTS} for t in transcripts]
    task = progress.add_task(f"{len(transcripts)} transcripts x {len(VARIANTS)} variants on {settings.model}",
                             total=len(transcripts) * len(VARIANTS))
    params = SamplingParams(max_tokens=settings.max_tokens, temperature=0.0)
    keep = policies.settings.masks.keep_last_tool_observations
    results = []
    for first in range(0, len(transcripts), settings.batch):
        batch = slice(first, first + settings.batch)
        completions = _run_batch(engine, prompts[batch], params, lambda n: progress.advance(task, n))
        for transcript, variant_prompts, done in zip(transcripts[batch], prompts[batch], completions, strict=True):
            outcomes = {v: _outcome(variant_prompts[v], done[v], transcript.answer) for v in VARIANTS}
            results.append(TranscriptResult(transcript, outcomes, keep))
    return Measured(results, engine, policies, time.perf_counter() - start)
