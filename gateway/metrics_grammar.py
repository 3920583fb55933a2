"""Structured-output metrics from the engine's cumulative grammar counters
(`engine.core.sampling.grammar_spec.GrammarCounters`),
turned into Prometheus counter increments per source like the other engine totals. Mask time per step is
`grammar_mask_seconds_total` over `grammar_mask_steps_total`; the compile cache's hit rate is
`grammar_compile_cache_hits_total` over `grammar_compile_cache_queries_total`.

Likewise the history policies' picks (`engine.mask.HistoryCounters`), by policy: the share of its history a
decode step reads is `history_blocks_attended_total` over `history_blocks_held_total`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from prometheus_client import CollectorRegistry, Counter

from engine import GrammarCounters, HistoryCounters

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
class CumulativeCounters:
    """Prometheus counters fed from an engine's cumulative totals, per source (a total that drops: a restart)."""

    counters: dict[str, Counter]
    last: dict[str, float] = field(default_factory=dict)  # source:counter:labels -> the cumulative total last seen

    @classmethod
    def register(cls, registry: CollectorRegistry, docs: dict[str, tuple[str, str]],
                 labels: tuple[str, ...] = ()) -> CumulativeCounters:
        return cls({name: Counter(PREFIX + metric, doc, labels, registry=registry)
                    for name, (metric, doc) in docs.items()})

    def advance(self, name: str, source: str, total: float, *labels: str) -> None:
        key = ":".join((source, name, *labels))
        previous, self.last[key] = self.last.get(key, 0.0), float(total)
        counter = self.counters[name].labels(*labels) if labels else self.counters[name]
        counter.inc(total if total < previous else total - previous)


HISTORY_DOCS = {
    "picks": ("history_picks_total", "Picks of the history blocks a request's decode steps read, by policy."),
    "held_blocks": ("history_blocks_held_total", "Full history blocks held at those picks, by policy."),
    "attended_blocks": ("history_blocks_attended_total", "History blocks those picks left attended, by policy."),
}


@dataclass
class GrammarMetrics:
    grammar: CumulativeCounters
    history: CumulativeCounters

    @classmethod
    def register(cls, registry: CollectorRegistry) -> GrammarMetrics:
        return cls(CumulativeCounters.register(registry, DOCS),
                   CumulativeCounters.register(registry, HISTORY_DOCS, ("policy",)))

    def sync(self, grammar: GrammarCounters, history: HistoryCounters, source: str) -> None:
        for item in fields(grammar):
            self.grammar.advance(item.name, source, getattr(grammar, item.name))
        for name in HISTORY_DOCS:
            for policy, total in getattr(history, name).items():
                self.history.advance(name, source, total, policy)
