"""The structured-outputs benchmark's runs: validity of forced tool calls and of json_schema replies against the
unconstrained replies to the same prompts and seeds, the cost of the masks at batch 1 and 16 on outputs of the same
length, and jump-forward against plain constrained decoding on tool-call outputs (greedy: the same texts)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agents_eval.bench.structured.measure import (
    Bench,
    Run,
    calls_valid,
    object_valid,
    sample_texts,
    schema_params,
    share,
    tool_params,
)
from agents_eval.bench.structured.tasks import agent_tasks, schema_tasks
from agents_eval.report import check_settings
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams

BATCH = 16


@dataclass(frozen=True)
class StructuredBenchSettings:
    model: str = "smollm2"
    tasks: int = 100  # agent tasks with 1-4 tools, tool_choice required
    schemas: int = 50  # pydantic-style response_format schemas
    cost_requests: int = 16  # tool-call prompts timed all at once, at most 16 (and the first 4 one by one)
    max_tokens: int = 96
    seed: int = 0
    num_threads: int = 0  # 0: every core

    def validate(self) -> None:
        check_settings([(self.tasks >= 1, "--tasks must be at least 1"),
                        (self.schemas >= 1, "--schemas must be at least 1"),
                        (self.cost_requests >= 1, "--cost-requests must be at least 1"),
                        (self.max_tokens >= 8, "--max-tokens must be at least 8"),
                        (self.num_threads >= 0, "--threads must be at least 1 (0: every core)")])

    @property
    def threads(self) -> int:
        return self.num_threads or os.cpu_count() or 1


def measure(settings: StructuredBenchSettings) -> dict[str, Any]:
    engine = LLMEngine(settings.model, EngineSettings(num_threads=settings.threads, num_kv_blocks=2048))
    bench = Bench(engine)
    return {"validity": validity(bench, settings), "cost": cost(bench, settings),
            "engine_counters": vars(engine.grammar_counters())}


def validity(bench: Bench, settings: StructuredBenchSettings) -> dict[str, Any]:
    tasks = agent_tasks(settings.tasks, settings.seed)
    prompts = [bench.prompt(t.messages(), t.chat_tools()) for t in tasks]
    figures: dict[str, Any] = {}
    for constrained in (True, False):
        run = bench.in_batches(prompts, [tool_params(t, settings.max_tokens, constrained) for t in tasks], BATCH)
        flags = [calls_valid(c.text, t) for c, t in zip(run.completions, tasks, strict=True)]
        figures["tool_calls_" + ("required" if constrained else "unconstrained")] = {
            "valid_share": share(flags), "replies": len(flags), "samples": sample_texts(run.completions)}
    schemas = schema_tasks(settings.schemas, settings.seed)
    schema_prompts = [bench.prompt(t.messages()) for t in schemas]
    for constrained in (True, False):
        run = bench.in_batches(schema_prompts, [schema_params(t, settings.max_tokens, constrained) for t in schemas],
                               BATCH)
        flags = [object_valid(c.text, t) for c, t in zip(run.completions, schemas, strict=True)]
        figures["json_schema_" + ("constrained" if constrained else "unconstrained")] = {
            "valid_share": share(flags), "replies": len(flags), "samples": sample_texts(run.completions)}
    return figures


def cost(bench: Bench, settings: StructuredBenchSettings) -> dict[str, Any]:
    tasks = agent_tasks(settings.cost_requests, settings.seed + 1)
    prompts = [bench.prompt(t.messages(), t.chat_tools()) for t in tasks]
    result: dict[str, Any] = {}
    for name, batch in (("batch_1", 1), ("batch_many", min(BATCH, len(tasks)))):
        count = min(len(tasks), 4) if batch == 1 else len(tasks)
        plain = bench.in_batches(prompts[:count], [tool_params(t, settings.max_tokens, True, False, 0.0)
                                                   for t in tasks[:count]], batch)
        jumped = bench.in_batches(prompts[:count], [tool_params(t, settings.max_tokens, True, True, 0.0)
                                                    for t in tasks[:count]], batch)
        lengths = [max(1, len(c.token_ids)) for c in plain.completions]
        free = bench.in_batches(prompts[:count], [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                                                  for n in lengths], batch)
        result[name] = {"batch_size": batch, **_cost_figures(plain, jumped, free)}
    return result


def _cost_figures(plain: Run, jumped: Run, free: Run) -> dict[str, Any]:
    same = [a.text == b.text for a, b in zip(plain.completions, jumped.completions, strict=True)]
    return {
        "unconstrained_tokens_per_s": free.tokens_per_s,
        "constrained_tokens_per_s": plain.tokens_per_s,
        "jump_forward_tokens_per_s": jumped.tokens_per_s,
        "throughput_overhead": 1 - plain.tokens_per_s / free.tokens_per_s if free.tokens_per_s else None,
        "mask_share_of_step": plain.mask_share_of_step,
        "mask_ms_per_step": 1000 * plain.grammar.mask_seconds / max(1, plain.grammar.mask_steps),
        "median_step_ms_constrained": 1000 * plain.median_step_s,
        "median_step_ms_unconstrained": 1000 * free.median_step_s,
        "jump_forward_speedup": plain.wall_s / jumped.wall_s if jumped.wall_s else None,
        "jump_forward_steps": jumped.steps, "plain_constrained_steps": plain.steps,
        "forced_tokens": jumped.grammar.forced_tokens, "output_tokens": jumped.output_tokens,
        "same_text_share": share(same), "requests": len(same),
    }
