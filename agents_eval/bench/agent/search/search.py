"""The SLO-rate search of `agentserve bench --workload` (DistServe's throughput): the highest arrival rate at
which at least `target` (90%) of the requests meet the SLO.

A pure function over `measure(rate) -> (attainment, figures)`, each call one full run at that rate:

1. bracket: probe the start rate; while it meets the target, multiply the rate by `growth` until a probe
   misses (or `max_rate` is reached); while it misses, divide by `growth` until one meets (or `min_rate`);
2. bisect the bracket at its geometric mean until `high / low - 1 <= precision`;

never more than `max_probes` probes in all. The rate found is the bracket's low end: the highest rate probed
that met the target, below the lowest that missed. An attainment that is NaN (nothing was sent) is a miss.
`search_in_turn` runs several such searches (one per configuration), one probe of each per round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")
SLO_TARGET = 0.9


@dataclass(frozen=True)
class SearchOptions:
    target: float = SLO_TARGET
    growth: float = 4.0  # fewer probes climbing to the knee; bisecting its bracket takes one more
    precision: float = 0.2  # relative: the bracket's high / low - 1
    max_probes: int = 9  # from 0.2 sessions/s: brackets and converges an SLO rate up to 51.2
    max_rate: float = math.inf
    min_rate: float = 0.0

    def check(self) -> list[tuple[bool, str]]:
        return [(0 < self.target <= 1, "the SLO target must be in (0, 1]"),
                (self.growth > 1, "--growth must be more than 1"),
                (self.precision > 0, "--precision must be positive"),
                (self.max_probes >= 1, "--max-probes must be at least 1"),
                (0 <= self.min_rate < self.max_rate, "--max-rate must be above the lowest rate probed")]


@dataclass(frozen=True)
class Probe(Generic[T]):
    rate: float
    attainment: float
    figures: T

    def met(self, target: float) -> bool:
        return self.attainment >= target  # False for NaN


@dataclass
class SearchResult(Generic[T]):
    target: float
    probes: list[Probe[T]] = field(default_factory=list)
    low: Probe[T] | None = None  # the highest rate that met the target, below `high`
    high: Probe[T] | None = None  # the lowest rate that missed it

    @property
    def rate(self) -> float:
        """The SLO rate: the bracket's low end; 0.0 when no probe met the target."""
        return self.low.rate if self.low is not None else 0.0

    @property
    def capped(self) -> bool:
        """Every probe met the target: the rate found is a lower bound."""
        return self.low is not None and self.high is None

    def width(self) -> float:
        if self.low is None or self.high is None:
            return math.inf
        return self.high.rate / self.low.rate - 1.0

    def converged(self, precision: float) -> bool:
        return self.width() <= precision


def search_slo_rate(measure: Callable[[float], tuple[float, T]], start: float,
                    options: SearchOptions = SearchOptions()) -> SearchResult[T]:
    """The highest rate meeting `options.target` within `options.precision`, in `options.max_probes` probes."""
    return search_in_turn({None: measure}, start, options)[None]


def search_in_turn(measures: Mapping[K, Callable[[float], tuple[float, T]]], start: float,
                   options: SearchOptions = SearchOptions()) -> dict[K, SearchResult[T]]:
    """One search per key, their probes taken in turn: a round probes every search not yet done once, in the
    keys' order. Each search probes the rates it would alone; on a host whose speed drifts, the drift lands on
    every key alike instead of on whichever searched last."""
    if not start > 0:
        raise ValueError(f"the search's start rate must be positive, got {start}")
    first = min(max(start, options.min_rate), options.max_rate)
    results: dict[K, SearchResult[T]] = {key: SearchResult(options.target) for key in measures}
    while True:
        due: list[tuple[K, float]] = []
        for key in measures:
            rate = next_rate(results[key], first, options)
            if rate is not None:
                due.append((key, rate))
        if not due:
            return results
        for key, rate in due:
            attainment, figures = measures[key](rate)
            record(results[key], Probe(rate, attainment, figures))


def next_rate(result: SearchResult[T], first: float, options: SearchOptions) -> float | None:
    """The rate the search probes next, or None when it is done: bracket from `first` (multiply by `growth`
    while probes meet the target, divide while they miss, within the rate bounds), then bisect the bracket at its
    geometric mean until it is within `precision`; never more than `max_probes` probes."""
    if len(result.probes) >= options.max_probes:
        return None
    if not result.probes:
        return first
    if result.low is not None and result.high is not None:
        if result.converged(options.precision):
            return None
        return math.sqrt(result.low.rate * result.high.rate)
    last = result.probes[-1]
    met = last.met(result.target)
    edge = options.max_rate if met else options.min_rate
    if last.rate == edge:
        return None
    return min(last.rate * options.growth, edge) if met else max(last.rate / options.growth, edge)


def record(result: SearchResult[T], probe: Probe[T]) -> None:
    result.probes.append(probe)
    if probe.met(result.target):
        result.low = probe
    else:
        result.high = probe
