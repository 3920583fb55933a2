"""Run every transcript under every variant through the engine, greedy, and score the answers.

Screening (the default): every transcript runs under `full` first, and only those whose question full answers
run under the other variants; retention is measured on those alone, so the rest would add compute and no
answer. `screen=False` runs every variant on every transcript.

Transcripts go in batches: first `full` and `pruned`, then the variants that share their prefixes
(`age` shares full's tokens up to its first mask, `pruned+age` pruned's), so the prefix cache computes shared
blocks once. A `query` or `attention` variant's history (up to its last turn) is prefilled first, as the earlier
turns of a live session would have left it cached, so its last turn's prefill picks what it reads layer by layer;
what it read (`ChunkPicks`) gives its attended observation tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from rich.progress import Progress

from agents_eval.bench.quality.answers import mentions
from agents_eval.bench.quality.scoring import Outcome, TranscriptResult
from agents_eval.bench.quality.transcripts import Transcript, generate_transcripts
from agents_eval.bench.quality.variants import VARIANTS, VariantPrompt, build_prompt
from agents_eval.harness.report import check_settings
from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.block_selection import ChunkPicks
from engine.model.tokenizer import Tokenizer
from trajectory.agent import Policies
from trajectory.template.default import load_chat_template

SELECTING = tuple(v for v in VARIANTS if v.endswith(("query", "attention")))
HISTORIES = tuple(f"{v}:history" for v in SELECTING)
PHASES = (("full", "pruned"), ("age", "pruned+age", "dropped"), HISTORIES, SELECTING)
HISTORY_PARAMS = SamplingParams(max_tokens=1, temperature=0.0)  # a history's prefill is what is wanted of it
Advance = Callable[[int], None]


@dataclass(frozen=True)
class QualityBenchSettings:
    model: str = "smollm2"
    transcripts: int = 100
    seed: int = 0
    max_tokens: int = 24
    batch: int = 4  # transcripts per engine batch
    num_threads: int = 0  # 0: every core
    screen: bool = True  # the variants other than full only on the transcripts full answers
    variants: tuple[str, ...] = VARIANTS  # full always runs: the reference
    indices: tuple[int, ...] = ()  # only these of the seed's transcripts (e.g. those full answered before)

    def validate(self) -> None:
        unknown = sorted(set(self.variants) - set(VARIANTS))
        check_settings([
            (not unknown, f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})"),
            (all(i >= 0 for i in self.indices), "--indices must be transcript numbers, 0 or more"),
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


@dataclass
class Answer:
    completion: Completion
    picks: list[ChunkPicks]  # what the prefill chunks of a `query` or `attention` request read


def complete(engine: LLMEngine, prompts: Sequence[VariantPrompt], params: SamplingParams,
             advance: Advance) -> list[Answer]:
    ids = [engine.add_request(p.token_ids, params, masked_spans=p.masked_spans, selection=p.selection)
           for p in prompts]
    results = {request_id: Completion(request_id) for request_id in ids}
    while engine.has_unfinished():
        for out in engine.step():
            results[out.request_id].add(out)
            advance(1 if out.finished else 0)
    picks = engine.runner.summaries.chunk_picks
    return [Answer(results[request_id], [] if picks is None else picks.pop(request_id, [])) for request_id in ids]


def _job_prompt(prompts: dict[str, VariantPrompt], job: str) -> VariantPrompt:
    """A variant's prompt, or (`<variant>:history`) its history: the tokens before its last turn."""
    variant, _, part = job.partition(":")
    prompt = prompts[variant]
    if not part or prompt.selection is None or not prompt.selection.kept_from:
        return prompt
    return replace(prompt, token_ids=prompt.token_ids[:prompt.selection.kept_from])


def _run_batch(engine: LLMEngine, prompts: Sequence[dict[str, VariantPrompt]], params: SamplingParams,
               advance: Advance, done: list[dict[str, Answer]]) -> None:
    """Every job of every phase not yet in `done` (a screened transcript's `full`), in place."""
    for jobs_of_phase in PHASES:
        jobs = [(i, job) for i in range(len(prompts)) for job in jobs_of_phase
                if job not in done[i] and job.partition(":")[0] in prompts[i]]
        answers = complete(engine, [_job_prompt(prompts[i], job) for i, job in jobs],
                           HISTORY_PARAMS if jobs_of_phase == HISTORIES else params, advance)
        for (i, job), answer in zip(jobs, answers, strict=True):
            done[i][job] = answer


def attended_observation_tokens(prompt: VariantPrompt, picks: Sequence[ChunkPicks]) -> float:
    """Observation tokens the answer's first token reads: the masks' count, or, where the last prefill chunk
    picked the history it reads, the mean over layers of what each layer's picks left it."""
    chunk = _last_chunk(prompt, picks)
    if chunk is None:
        return prompt.attended_observation_tokens
    history_end = chunk.history_blocks * chunk.block_size
    per_layer = [prompt.picked_observation_tokens(history_end, chunk.attended_positions(layer))
                 for layer in range(len(chunk.attended))]
    return sum(per_layer) / len(per_layer)


def asked_observation_read(prompt: VariantPrompt, picks: Sequence[ChunkPicks], target: int) -> float | None:
    """The share of the asked observation's tokens the answer's first token read, averaged over layers, where the
    engine picked (None elsewhere): whether a lost answer was lost by the picks or by the model."""
    chunk = _last_chunk(prompt, picks)
    if chunk is None:
        return None
    start, end = prompt.observation_spans[target]
    history_end = chunk.history_blocks * chunk.block_size
    shares = [sum(1 for i in range(start, end) if i >= history_end or i in chunk.attended_positions(layer))
              / (end - start) for layer in range(len(chunk.attended))]
    return sum(shares) / len(shares)


def _last_chunk(prompt: VariantPrompt, picks: Sequence[ChunkPicks]) -> ChunkPicks | None:
    last = [chunk for chunk in picks if chunk.start < len(prompt.token_ids)][-1:]
    return last[0] if last else None


def _outcome(prompt: VariantPrompt, answer: Answer, expected: str, target: int) -> Outcome:
    completion = answer.completion
    return Outcome(completion.text, completion.token_ids, prompt.observation_tokens,
                   attended_observation_tokens(prompt, answer.picks), mentions(completion.text, expected),
                   completion.num_prompt_tokens, completion.num_cached_tokens,
                   asked_observation_read(prompt, answer.picks, target))


def measure(settings: QualityBenchSettings, engine_settings: EngineSettings, progress: Progress,
            on_batch: Callable[[Measured], object] | None = None) -> Measured:
    """Every transcript under every variant (screened: the others only where full answers); `on_batch` hears
    the transcripts finished so far after every engine batch, so a long run leaves a report as it goes."""
    start = time.perf_counter()
    torch.set_num_threads(settings.threads)
    engine = LLMEngine(settings.model, engine_settings.model_copy(update={"num_threads": settings.threads}))
    engine.runner.summaries.chunk_picks = {}  # what each `query` and `attention` prefill chunk read
    template, tokenizer, policies = load_chat_template(engine.checkpoint), _tokenizer(engine), Policies.load()
    transcripts = _transcripts(settings)
    wanted = ("full", *(v for v in VARIANTS if v in settings.variants and v != "full"))
    prompts = [{v: build_prompt(t, v, template, tokenizer, policies) for v in wanted} for t in transcripts]
    params = SamplingParams(max_tokens=settings.max_tokens, temperature=0.0)
    done: list[dict[str, Answer]] = [{} for _ in transcripts]
    keep = policies.settings.masks.keep_last_tool_observations

    def measured() -> Measured:
        finished = [i for i, t in enumerate(transcripts) if set(wanted) <= done[i].keys()
                    or (settings.screen and "full" in done[i] and not full_answers(done[i]["full"], t))]
        results = [TranscriptResult(transcripts[i], {v: _outcome(prompts[i][v], done[i][v], transcripts[i].answer,
                                                                 transcripts[i].target)
                                                     for v in wanted if v in done[i]}, keep) for i in finished]
        return Measured(results, engine, policies, time.perf_counter() - start)

    def batch_done() -> None:
        if on_batch is not None:
            on_batch(measured())

    if settings.screen:
        _screen(engine, [p["full"] for p in prompts], params, progress, settings.batch, done, batch_done)
    chosen = [i for i, t in enumerate(transcripts) if not settings.screen or full_answers(done[i]["full"], t)]
    histories = sum(1 for v in wanted if v in SELECTING)
    task = progress.add_task(f"{len(chosen)} transcripts x {len(wanted)} variants on {settings.model}",
                             total=len(chosen) * (len(wanted) + histories - int(settings.screen)))
    for batch in _batches(len(chosen), settings.batch):
        picked = [chosen[j] for j in batch]
        _run_batch(engine, [prompts[i] for i in picked], params, lambda n: progress.advance(task, n),
                   [done[i] for i in picked])
        batch_done()
    return measured()


def _screen(engine: LLMEngine, prompts: Sequence[VariantPrompt], params: SamplingParams, progress: Progress,
            size: int, done: list[dict[str, Answer]], batch_done: Callable[[], None]) -> None:
    """Every transcript under full, in batches of `size`: `done[i]["full"]`."""
    task = progress.add_task(f"{len(prompts)} transcripts under full", total=len(prompts))
    for batch in _batches(len(prompts), size):
        answers = complete(engine, [prompts[i] for i in batch], params, lambda n: progress.advance(task, n))
        for i, answer in zip(batch, answers, strict=True):
            done[i]["full"] = answer
        batch_done()


def _transcripts(settings: QualityBenchSettings) -> list[Transcript]:
    if not settings.indices:
        return generate_transcripts(settings.transcripts, settings.seed)
    every = generate_transcripts(max(settings.indices) + 1, settings.seed)
    return [every[i] for i in sorted(set(settings.indices))]


def full_answers(answer: Answer, transcript: Transcript) -> bool:
    """The screen: whether full's answer holds the expected string."""
    return mentions(answer.completion.text, transcript.answer)


def _batches(count: int, size: int) -> list[list[int]]:
    return [list(range(first, min(first + size, count))) for first in range(0, count, size)]
