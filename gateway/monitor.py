"""`agentserve monitor`: a live terminal view of one metric from a gateway's `/metrics`, with the worker
role split (`agentserve:num_workers{role}`) and the capacity alerts firing (`agentserve:capacity_alert{alert}`
at 1). A metric is named with or without the `agentserve:` prefix, by sample name (`..._total`) or family
name; a histogram shows its count, sum and mean; the ratios in DERIVED are computed from two counters.
In the live view monotonic rows also show their rate per second since the previous scrape. Below, the KV
tiers (host, disk, redis) with their hit ratio, blocks and bytes held, promotions and demotions."""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gateway.metrics import PREFIX
from gateway.settings import GatewaySettings

DERIVED = {  # name -> (numerator, denominator) counters
    "kvcache_hit_ratio": (f"{PREFIX}prefix_cache_hits_total", f"{PREFIX}prefix_cache_queries_total"),
    "cached_prompt_ratio": (f"{PREFIX}cached_tokens_total", f"{PREFIX}prompt_tokens_total"),
}
WORKERS, ALERTS = f"{PREFIX}num_workers", f"{PREFIX}capacity_alert"
TIER_COLUMNS = {  # column -> sample, per `tier` label (gateway.metrics.TierMetrics)
    "queries": f"{PREFIX}kvcache_tier_queries_total", "hits": f"{PREFIX}kvcache_tier_hits_total",
    "blocks": f"{PREFIX}kvcache_blocks", "bytes": f"{PREFIX}kvcache_bytes",
    "promoted": f"{PREFIX}kvcache_promoted_blocks_total", "demoted": f"{PREFIX}kvcache_demoted_blocks_total",
    "skipped": f"{PREFIX}kvcache_tier_skipped_total",
}
LOAD_DECISIONS = f"{PREFIX}kvcache_load_decisions_total"
MONOTONIC_SUFFIXES = ("_total", "_count", "_sum")
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float


@dataclass(frozen=True)
class Scrape:
    families: dict[str, tuple[str, list[Sample]]]  # family name -> (type, samples)
    samples: dict[str, list[Sample]]  # sample name -> samples


@dataclass(frozen=True)
class Row:
    label: str
    value: float | None
    monotonic: bool = False


def parse_interval(text: str) -> float:
    """Seconds in `1s`, `500ms`, `2` (seconds), `0.5s`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"cannot read the interval {text!r}: use a positive duration like 1s, 500ms or 2")
    seconds = float(match.group(1))
    return seconds / 1000 if match.group(2) == "ms" else seconds


def parse_metrics(text: str) -> Scrape:
    families: dict[str, tuple[str, list[Sample]]] = {}
    samples: dict[str, list[Sample]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        parsed = [Sample(s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples]
        families[family.name] = (family.type, parsed)
        for sample in parsed:
            samples[sample.name].append(sample)
    return Scrape(families, dict(samples))


def fetch(url: str, timeout_s: float = 5.0) -> Scrape:
    endpoint = f"{url.rstrip('/')}/metrics"
    try:
        response = httpx.get(endpoint, timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise ValueError(f"cannot read {endpoint}: {error}") from None
    return parse_metrics(response.text)


def _label(sample: Sample) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in sample.labels if k != "le")
    return f"{sample.name}{{{labels}}}" if labels else sample.name


def _sample_rows(samples: list[Sample]) -> list[Row]:
    return [Row(_label(s), s.value, s.name.endswith(MONOTONIC_SUFFIXES)) for s in samples]


def _histogram_rows(name: str, samples: list[Sample]) -> list[Row]:
    totals = [s for s in samples if s.name in (f"{name}_count", f"{name}_sum")]
    rows = _sample_rows(totals)
    sums = {s.labels: s.value for s in totals if s.name.endswith("_sum")}
    for count in (s for s in totals if s.name.endswith("_count")):
        mean = sums.get(count.labels, 0.0) / count.value if count.value else None
        rows.append(Row(_label(Sample(f"{name}_mean", count.labels, 0.0)), mean))
    return rows


def _derived_row(scrape: Scrape, name: str) -> Row:
    numerator, denominator = (sum(s.value for s in scrape.samples.get(n, [])) for n in DERIVED[name])
    return Row(name, numerator / denominator if denominator else None)


def metric_rows(scrape: Scrape, metric: str) -> list[Row]:
    bare = metric.removeprefix(PREFIX)
    if bare in DERIVED:
        return [_derived_row(scrape, bare)]
    for name in (PREFIX + bare, bare):
        if name in scrape.samples:
            return _sample_rows(scrape.samples[name])
        if name in scrape.families:
            kind, samples = scrape.families[name]
            return _histogram_rows(name, samples) if kind in ("histogram", "summary") else _sample_rows(samples)
    known = sorted({n.removeprefix(PREFIX) for n in scrape.samples} | set(DERIVED))
    raise ValueError(f"unknown metric {metric!r}; this server exports: {', '.join(known)}")


def role_split(scrape: Scrape) -> dict[str, float]:
    return {dict(s.labels).get("role", "?"): s.value for s in scrape.samples.get(WORKERS, [])}


def active_alerts(scrape: Scrape) -> list[str]:
    return sorted(dict(s.labels).get("alert", "?") for s in scrape.samples.get(ALERTS, []) if s.value >= 1)


def kv_tiers(scrape: Scrape) -> dict[str, dict[str, float]]:
    """Per tier: the TIER_COLUMNS values and its hit ratio; empty when the engine has no lower tiers."""
    tiers: dict[str, dict[str, float]] = defaultdict(dict)
    for column, name in TIER_COLUMNS.items():
        for sample in scrape.samples.get(name, []):
            tiers[dict(sample.labels).get("tier", "?")][column] = sample.value
    for values in tiers.values():
        values["hit_ratio"] = values.get("hits", 0.0) / values["queries"] if values.get("queries") else 0.0
    return dict(tiers)


def _tier_table(scrape: Scrape) -> RenderableType:
    tiers = kv_tiers(scrape)
    if not tiers:
        return Text("kv tiers: none")
    table = Table(title="KV tiers")
    columns = ["hit_ratio", "blocks", "bytes", "promoted", "demoted", "skipped"]
    for column in ["tier", *columns]:
        table.add_column(column, justify="left" if column == "tier" else "right")
    for tier, values in sorted(tiers.items()):
        table.add_row(tier, *(format_value(values.get(column)) for column in columns))
    decisions = {dict(s.labels).get("outcome", "?"): s.value for s in scrape.samples.get(LOAD_DECISIONS, [])}
    loaded, recomputed = (format_value(decisions.get(k, 0.0)) for k in ("loaded", "recomputed"))
    return Group(table, Text(f"blocks loaded {loaded}, recomputed {recomputed}"))


def format_value(value: float | None) -> str:
    if value is None:
        return "n/a"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def _rate(row: Row, before: float | None, elapsed_s: float) -> float | None:
    if not row.monotonic or row.value is None or before is None or elapsed_s <= 0:
        return None
    return (row.value - before) / elapsed_s


def render(scrape: Scrape, metric: str, previous: Scrape | None = None, elapsed_s: float = 0.0) -> Group:
    rows = metric_rows(scrape, metric)
    before = {row.label: row.value for row in metric_rows(previous, metric)} if previous else {}
    table = Table(title=f"agentserve monitor: {metric}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("per s", justify="right")
    for row in rows:
        rate = _rate(row, before.get(row.label), elapsed_s)
        table.add_row(row.label, format_value(row.value), "" if rate is None else format_value(rate))
    roles = role_split(scrape)
    split = ", ".join(f"{role} {format_value(count)}" for role, count in sorted(roles.items())) or "not exported"
    alerts = active_alerts(scrape)
    return Group(table, Text(f"workers: {split}"), Text(f"alerts: {', '.join(alerts) or 'none'}"),
                 _tier_table(scrape))


def default_url() -> str:
    settings = GatewaySettings()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metric", required=True, help="metric name, with or without 'agentserve:', or one of "
                        f"{', '.join(DERIVED)}")
    parser.add_argument("--interval", default="1s", help="refresh interval: 1s, 500ms, 2")
    parser.add_argument("--url", help="gateway base URL (default: host and port of configs/gateway.yaml)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    interval_s = parse_interval(args.interval)
    url = args.url or default_url()
    console = Console()
    if not console.is_terminal:
        console.width = 160  # rather than wrap long label sets at 80 columns
    scrape = fetch(url)
    view = render(scrape, args.metric)  # an unknown metric fails here, before the live view starts
    if args.once:
        console.print(view)
    else:
        _watch(url, args.metric, interval_s, console, scrape)


def _watch(url: str, metric: str, interval_s: float, console: Console, scrape: Scrape) -> None:
    if not console.is_terminal:  # a pipe or a file: one snapshot after another
        console.print(render(scrape, metric))
        _poll(url, metric, interval_s, scrape, console.print)
        return
    with Live(render(scrape, metric), console=console, auto_refresh=False) as live:
        _poll(url, metric, interval_s, scrape, lambda view: live.update(view, refresh=True))


def _poll(url: str, metric: str, interval_s: float, scrape: Scrape, show: Callable[[RenderableType], None]
          ) -> None:
    scraped_at = time.monotonic()
    while True:
        time.sleep(interval_s)
        try:
            current = fetch(url)
        except ValueError as error:  # keep the last view, marked stale, until the server answers again
            show(Group(render(scrape, metric), Text(f"stale: {error}")))
            continue
        now = time.monotonic()
        show(render(current, metric, scrape, now - scraped_at))
        scrape, scraped_at = current, now


def register(sub: argparse._SubParsersAction) -> None:
    add_arguments(sub.add_parser("monitor", help="live view of a metric, the role split and alerts"))
