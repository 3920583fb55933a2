"""Goals, tables and the chart of `bench kv-cache`: hit ratio per policy and cache size against the bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.bench.kv_cache.settings import KVCacheBenchSettings
from agents_eval.harness.report import LineChart, Table, write_report

MARKDOWN = "report.md"
CHART = "hit_ratio.png"


def goals(report: dict[str, Any], settings: KVCacheBenchSettings) -> dict[str, Any]:
    """LFU above LRU at every size, and LFU at the configured size within bound_share of the bound."""
    lfu, lru, bound = report["hit_ratio"]["lfu"], report["hit_ratio"]["lru"], report["bound"]
    not_above = [size for size in settings.sizes if lfu[size] <= lru[size]]
    at_configured = lfu[settings.configured_blocks] / bound if bound else 0.0
    reaching = [size for size in settings.sizes if bound and lfu[size] / bound >= settings.bound_share]
    return {"lfu_above_lru_at_every_size": not not_above, "sizes_not_above_lru": not_above,
            "lfu_share_of_bound_at_configured": at_configured,
            "configured_reaches_bound_share": at_configured >= settings.bound_share,
            "smallest_size_reaching_bound_share": min(reaching) if reaching else None}


def _table(report: dict[str, Any], settings: KVCacheBenchSettings) -> Table:
    lfu, lru, bound = report["hit_ratio"]["lfu"], report["hit_ratio"]["lru"], report["bound"]
    rows = [[f"{size:,}" + (" (configured)" if size == settings.configured_blocks else ""), f"{lfu[size]:.4f}",
             f"{lru[size]:.4f}", f"{lfu[size] - lru[size]:+.4f}", f"{lfu[size] / bound:.1%}" if bound else "-"]
            for size in settings.sizes]
    return Table("Hit ratio per cache size", ["cache blocks", "lfu", "lru", "lfu - lru", "lfu / bound"], rows)


def _notes(report: dict[str, Any], settings: KVCacheBenchSettings) -> list[str]:
    g = report["goals"]
    above = "yes" if g["lfu_above_lru_at_every_size"] else f"no, not at {g['sizes_not_above_lru']}"
    verdict = "met" if g["configured_reaches_bound_share"] else "missed"
    return [f"{report['requests']:,} requests, {report['distinct_blocks']:,} distinct blocks; bound (unbounded "
            f"cache): {report['bound']:.4f}",
            f"LFU above LRU at every size: {above}",
            f"LFU at the configured {settings.configured_blocks:,} blocks: {g['lfu_share_of_bound_at_configured']:.1%}"
            f" of the bound (goal {settings.bound_share:.0%}: {verdict})"
            f"; smallest size reaching it: {g['smallest_size_reaching_bound_share']}"]


def _engine_table(replay: dict[str, Any]) -> Table:
    rows = [[tier, str(c["queries"]), str(c["hits"]), str(c["demoted"]), str(c["promoted"]),
             f"{replay['bytes_per_s'].get(tier, 0) / 1e6:.0f}"] for tier, c in replay["tiers"].items()]
    return Table(f"Engine replay: {replay['loaded']} blocks loaded, {replay['recomputed']} recomputed; prefill "
                 f"{replay['prefill_tokens_per_s']:.0f} tokens/s, {replay['cached_tokens']:,} of "
                 f"{replay['prompt_tokens']:,} prompt tokens cached",
                 ["tier", "queries", "hits", "demoted", "promoted", "load MB/s"], rows)


def write(out_dir: Path, report: dict[str, Any], settings: KVCacheBenchSettings) -> None:
    sizes = list(settings.sizes)
    series = {policy: [report["hit_ratio"][policy][size] for size in sizes] for policy in report["hit_ratio"]}
    series["bound"] = [report["bound"]] * len(sizes)
    chart = LineChart(CHART, "Prefix hit ratio against cache size", "cache size (trace blocks)", "hit ratio",
                      sizes, series)
    tables = [_table(report, settings)]
    if "engine_replay" in report:
        tables.append(_engine_table(report["engine_replay"]))
    write_report(out_dir, report, "bench kv-cache", tables, chart, _notes(report, settings))
