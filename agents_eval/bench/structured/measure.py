"""The structured-outputs benchmark's measurements on one in-process engine, prompts rendered by the model's
chat template as the gateway renders them, grammars built as the gateway builds them (`gateway.api.structured`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from agents_eval.bench.structured.tasks import TOOLS, AgentTask, SchemaTask
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.grammar_spec import GrammarCounters, GrammarSpec
from engine.core.sampling.sampler import SamplingParams
from gateway.api.structured import schema_spec, tool_call_grammar
from gateway.api.tool_calls import parse_tool_calls
from trajectory.template.default import load_chat_template
from trajectory.template.types import Message


@dataclass
class Run:
    completions: list[Completion]
    wall_s: float
    step_s: list[float]  # each step's duration
    grammar: GrammarCounters  # what this run added to the engine's counters

    @property
    def steps(self) -> int:
        return len(self.step_s)

    @property
    def median_step_s(self) -> float:
        """A decode step's time: most steps decode (the few prefill steps are the long ones)."""
        ordered = sorted(self.step_s)
        return ordered[len(ordered) // 2] if ordered else 0.0

    @property
    def output_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mask_share_of_step(self) -> float:
        """A masked step's mask time (computing and applying the bitmasks) over the median step's time."""
        if not self.grammar.mask_steps or not self.median_step_s:
            return 0.0
        return (self.grammar.mask_seconds / self.grammar.mask_steps) / self.median_step_s


class Bench:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.template = load_chat_template(engine.checkpoint)
        if engine.tokenizer is None:
            raise ValueError("the structured-outputs benchmark needs a model with a tokenizer")
        self.tokenizer = engine.tokenizer

    def prompt(self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = self.template.render([Message.from_openai(m) for m in messages], tools,
                                    add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def run(self, prompts: list[list[int]], params: list[SamplingParams]) -> Run:
        before = self.engine.grammar_counters()
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        results = {i: Completion(i) for i in ids}
        started = time.perf_counter()
        step_s = []
        while self.engine.has_unfinished():
            step_started = time.perf_counter()
            for out in self.engine.step():
                results[out.request_id].add(out)
            step_s.append(time.perf_counter() - step_started)
        wall = time.perf_counter() - started
        return Run([results[i] for i in ids], wall, step_s, _minus(self.engine.grammar_counters(), before))

    def in_batches(self, prompts: list[list[int]], params: list[SamplingParams], batch: int) -> Run:
        runs = [self.run(prompts[i:i + batch], params[i:i + batch]) for i in range(0, len(prompts), batch)]
        total = GrammarCounters()
        for run in runs:
            total.add(run.grammar)
        return Run([c for r in runs for c in r.completions], sum(r.wall_s for r in runs),
                   [s for r in runs for s in r.step_s], total)


def _minus(after: GrammarCounters, before: GrammarCounters) -> GrammarCounters:
    names = ("constrained_requests", "forced_tokens", "compile_queries", "compile_hits", "compile_seconds",
             "mask_seconds", "mask_steps")
    return replace(after, **{n: getattr(after, n) - getattr(before, n) for n in names})


def tool_params(task: AgentTask, max_tokens: int, constrained: bool, jump_forward: bool = True,
                temperature: float = 0.7) -> SamplingParams:
    grammar = tool_call_grammar(task.chat_tools(), many=False) if constrained else None  # parallel_tool_calls off
    if grammar is not None and not jump_forward:
        grammar = GrammarSpec(grammar.kind, grammar.source, jump_forward=False)
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=task.index, grammar=grammar)


def calls_valid(text: str, task: AgentTask) -> bool:
    """At least one call, each naming one of the task's tools with arguments its pydantic model accepts."""
    _, calls = parse_tool_calls(text)
    if not calls:
        return False
    for call in calls:
        name = call["function"]["name"]
        if name not in task.tools:
            return False
        try:
            TOOLS[name][0].model_validate_json(call["function"]["arguments"])
        except ValueError:
            return False
    return True


def schema_params(task: SchemaTask, max_tokens: int, constrained: bool) -> SamplingParams:
    grammar = schema_spec(task.model.model_json_schema(), strict=True) if constrained else None
    return SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=task.index, grammar=grammar)


def object_valid(text: str, task: SchemaTask) -> bool:
    """The reply's JSON (the whole reply, or the object inside a code fence or prose) validates."""
    start, end = text.find("{"), text.rfind("}")
    candidates = [text.strip()] + ([text[start:end + 1]] if 0 <= start < end else [])
    for candidate in candidates:
        try:
            task.model.model_validate_json(candidate)
            return True
        except ValueError:
            continue
    return False


def share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def sample_texts(completions: list[Completion], count: int = 3) -> list[str]:
    return [json.dumps(c.text)[:300] for c in completions[:count]]
