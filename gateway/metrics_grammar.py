"""Structured-output metrics from the engine's cumulative grammar counters
(`engine.core.sampling.grammar_spec.GrammarCounters`),
turned into Prometheus counter increments per source like the other engine totals. Mask time per step is
`grammar_mask_seconds_total` over `grammar_mask_steps_total`; the compile cache's hit rate is
`grammar_compile_cache_hits_total` over `grammar_compile_cache_queries_total`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from prometheus_client import CollectorRegistry, Counter

from engine import GrammarCounters

PREFIX = "agentserve:"
DOCS = {
    "constrained_requests": ("structured_requests_total", "Requests whose output a grammar constrained "
                             "(response_format, forced tool calls)."),
    "forced_tokens": ("structured_forced_tokens_total", "Tokens a grammar forced, appended without sampling "
                      "(jump-forward)."),
    "compile_queries": ("grammar_compile_cache_queries_total", "Grammars looked up in the compiled-grammar cache."),
    "compile_hits": ("grammar_compile_cache_hits_total", "Grammars found compiled in the cache."),
    "compile_seconds": ("grammar_compile_seconds_total", "Seconds spent compiling grammars."),
    "mask_seconds": ("grammar_mask_seconds_total", "Seconds spent computing and applying token bitmasks."),
    "mask_steps": ("grammar_mask_steps_total", "Engine steps that masked at least one request's logits."),
}


@dataclass
class GrammarMetrics:
    counters: dict[str, Counter]
    last: dict[str, float] = field(default_factory=dict)  # source:counter -> the cumulative total last seen

    @classmethod
    def register(cls, registry: CollectorRegistry) -> GrammarMetrics:
        return cls({name: Counter(PREFIX + metric, doc, registry=registry) for name, (metric, doc) in DOCS.items()})

    def sync(self, totals: GrammarCounters, source: str) -> None:
        for item in fields(totals):
            total = float(getattr(totals, item.name))
            previous = self.last.get(f"{source}:{item.name}", 0.0)
            self.last[f"{source}:{item.name}"] = total
            self.counters[item.name].inc(total if total < previous else total - previous)  # a drop: a restart
