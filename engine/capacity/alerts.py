"""Inflection alerts: when the deployment's shape, not its size, is the problem.

- `decode_latency`: decode latency at or over `decode_over_prefill_latency` x prefill latency (the caller
  passes step times: mean decode step, mean prefill step) -> add decode capacity.
- `kv_hit_ratio`: prefix-cache hits / queries at or under `kv_hit_ratio_min` -> the eviction policy is
  struggling. Judged over windows of at least `kv_hit_min_queries` looked-up tokens; a window still filling
  leaves the alert as it was.
- `retransmits`: TCP RetransSegs / OutSegs at or over `retransmit_ratio_max`, from the deltas between reads of
  `/proc/net/snmp`, over windows of at least `retransmit_min_segments` sent segments -> check QoS. The first
  read only sets the baseline; without the file the alert is never evaluated.

Each fires at its threshold (the comparison allows float rounding) and not on the near side of it.
`AlertMonitor.evaluate` returns transitions only (fired or cleared), so the caller logs once per transition;
`gauges()` is 1 per active alert, 0 otherwise (`agentserve:capacity_alert{alert=...}`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine.capacity.settings import CapacitySettings

DECODE_LATENCY, KV_HIT_RATIO, RETRANSMITS = "decode_latency", "kv_hit_ratio", "retransmits"


@dataclass(frozen=True)
class _Rule:
    what: str
    advice: str
    high: bool  # fires at or above the threshold; False: at or below


RULES = {
    DECODE_LATENCY: _Rule("decode/prefill latency ratio", "add decode capacity", high=True),
    KV_HIT_RATIO: _Rule("KV hit ratio", "eviction policy struggling", high=False),
    RETRANSMITS: _Rule("TCP retransmit ratio", "check QoS", high=True),
}


@dataclass(frozen=True)
class AlertInputs:
    decode_latency_s: float | None = None  # None: not measured this interval
    prefill_latency_s: float | None = None
    prefix_cache_queries: int = 0  # cumulative tokens looked up
    prefix_cache_hits: int = 0  # cumulative tokens found


@dataclass(frozen=True)
class AlertTransition:
    alert: str
    firing: bool  # True: it fired; False: it cleared
    value: float
    threshold: float
    at: float
    message: str


@dataclass(frozen=True)
class TcpSegments:
    out_segs: int
    retrans_segs: int


def read_tcp_segments(path: Path) -> TcpSegments | None:
    """The Tcp counters of a `/proc/net/snmp`-format file; None when it is absent or has none."""
    try:
        lines = [line.split() for line in path.read_text().splitlines() if line.startswith("Tcp:")]
    except OSError:
        return None
    if len(lines) < 2:
        return None
    fields = dict(zip(lines[0][1:], lines[1][1:], strict=False))
    try:
        return TcpSegments(int(fields["OutSegs"]), int(fields["RetransSegs"]))
    except (KeyError, ValueError):
        return None


class _Window:
    """The ratio of two cumulative counters over windows holding at least `minimum` of the denominator."""

    def __init__(self, minimum: int, baseline: tuple[int, int] | None = None) -> None:
        self.minimum = minimum
        self.baseline = baseline

    def advance(self, numerator: int, denominator: int) -> float | None:
        if self.baseline is None or numerator < self.baseline[0] or denominator < self.baseline[1]:
            self.baseline = (numerator, denominator)  # first read, or the counters restarted
            return None
        seen = denominator - self.baseline[1]
        if seen < self.minimum:
            return None
        ratio = (numerator - self.baseline[0]) / seen
        self.baseline = (numerator, denominator)
        return ratio


def _crosses(value: float, threshold: float, high: bool) -> bool:
    if math.isclose(value, threshold, rel_tol=1e-9):
        return True
    return value > threshold if high else value < threshold


class AlertMonitor:
    def __init__(self, settings: CapacitySettings, snmp_path: Path | None = None) -> None:
        self.settings = settings
        self.snmp_path = snmp_path or settings.snmp_path
        self.thresholds = {DECODE_LATENCY: settings.decode_over_prefill_latency,
                           KV_HIT_RATIO: settings.kv_hit_ratio_min, RETRANSMITS: settings.retransmit_ratio_max}
        self.values: dict[str, float] = {}  # each alert's last evaluated value
        self._active: set[str] = set()
        self._kv = _Window(settings.kv_hit_min_queries, baseline=(0, 0))
        self._tcp = _Window(settings.retransmit_min_segments)

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(name for name in RULES if name in self._active)

    def gauges(self) -> dict[str, int]:
        return {name: int(name in self._active) for name in RULES}

    def evaluate(self, inputs: AlertInputs, now: float) -> list[AlertTransition]:
        readings = {DECODE_LATENCY: self._latency_ratio(inputs),
                    KV_HIT_RATIO: self._kv.advance(inputs.prefix_cache_hits, inputs.prefix_cache_queries),
                    RETRANSMITS: self._retransmit_ratio()}
        transitions = []
        for name, value in readings.items():
            if value is not None:
                self.values[name] = value
                transition = self._update(name, value, now)
                if transition is not None:
                    transitions.append(transition)
        return transitions

    def _latency_ratio(self, inputs: AlertInputs) -> float | None:
        if not inputs.decode_latency_s or not inputs.prefill_latency_s:
            return None
        return inputs.decode_latency_s / inputs.prefill_latency_s

    def _retransmit_ratio(self) -> float | None:
        segments = read_tcp_segments(self.snmp_path)
        return None if segments is None else self._tcp.advance(segments.retrans_segs, segments.out_segs)

    def _update(self, name: str, value: float, now: float) -> AlertTransition | None:
        rule, threshold = RULES[name], self.thresholds[name]
        firing = _crosses(value, threshold, rule.high)
        if firing == (name in self._active):
            return None
        if firing:
            self._active.add(name)
            sign = ">=" if rule.high else "<="
            message = f"{rule.what} {value:.4g} {sign} {threshold:g}: {rule.advice}"
        else:
            self._active.discard(name)
            message = f"{rule.what} {value:.4g} back {'under' if rule.high else 'over'} {threshold:g}: cleared"
        return AlertTransition(name, firing, value, threshold, now, message)
