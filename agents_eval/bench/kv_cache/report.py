"""Goals, tables and the chart of `bench kv-cache`: hit ratio per policy and cache size against the bound, on
the trace's second half (the fixed LFU's decay tuned on the first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents_eval.bench.kv_cache.settings import KVCacheBenchSettings
from agents_eval.harness.report import LineChart, Table, goal, write_report

MARKDOWN = "report.md"
CHART = "hit_ratio.png"


def headline(settings: KVCacheBenchSettings) -> str:
    """The policy the goals judge: the first one replayed (the adaptive policy by default)."""
    return settings.policies[0]


def goals(report: dict[str, Any], settings: KVCacheBenchSettings) -> list[dict[str, Any]]:
    """The headline policy at least LRU's hit ratio at every size (the smallest difference >= 0), and within
    bound_share of the bound at the configured size."""
    policy = headline(settings)
    mine, lru, bound = report["hit_ratio"][policy], report["hit_ratio"]["lru"], report["bound"]
    at_configured = mine[settings.configured_blocks] / bound if bound else 0.0
    return [goal(f"{policy} - lru hit ratio, smallest over the sizes", 0.0, "min",
                 min(mine[size] - lru[size] for size in settings.sizes)),
            goal(f"{policy} hit ratio at {settings.configured_blocks:,} blocks / bound", settings.bound_share, "min",
                 at_configured)]


def goal_details(report: dict[str, Any], settings: KVCacheBenchSettings) -> dict[str, Any]:
    policy = headline(settings)
    mine, lru, bound = report["hit_ratio"][policy], report["hit_ratio"]["lru"], report["bound"]
    reaching = [size for size in settings.sizes if bound and mine[size] / bound >= settings.bound_share]
    return {"policy": policy, "sizes_below_lru": [size for size in settings.sizes if mine[size] < lru[size]],
            "smallest_size_reaching_bound_share": min(reaching) if reaching else None}


def _table(report: dict[str, Any], settings: KVCacheBenchSettings) -> Table:
    ratios, bound, policy = report["hit_ratio"], report["bound"], headline(settings)
    names = list(ratios)
    rows = [[f"{size:,}" + (" (configured)" if size == settings.configured_blocks else ""),
             *(f"{ratios[name][size]:.4f}" for name in names), f"{ratios[policy][size] - ratios['lru'][size]:+.4f}",
             f"{ratios[policy][size] / bound:.1%}" if bound else "-"] for size in settings.sizes]
    return Table("Hit ratio per cache size, second half of the trace", ["cache blocks", *names, f"{policy} - lru",
                 f"{policy} / bound"], rows)


def _tuning_table(report: dict[str, Any], settings: KVCacheBenchSettings) -> Table:
    tuning = report["tuning"]["hit_ratio_first_half"]
    rows = [[f"{decay:g}", *(f"{tuning[decay][size]:.4f}" for size in settings.sizes)] for decay in tuning]
    return Table(f"Tuning the fixed LFU on the first half: decay_s {report['tuning']['decay_s']:g} chosen "
                 "(best mean hit ratio)", ["decay_s", *(f"{size:,}" for size in settings.sizes)], rows)


def _notes(report: dict[str, Any], settings: KVCacheBenchSettings) -> list[str]:
    details, split = report["goal_details"], report["split"]
    below = "none" if not details["sizes_below_lru"] else ", ".join(f"{s:,}" for s in details["sizes_below_lru"])
    return [f"Tuned on {split['tuned_on']}; every figure below on {split['reported_on']}: "
            f"{report['requests']:,} requests, {report['distinct_blocks']:,} distinct blocks; bound (unbounded "
            f"cache): {report['bound']:.4f}",
            f"Sizes where {details['policy']} hits less than LRU: {below}",
            *(f"Goal {g['name']}: {g['measured']:.4f} ({g['bound']} {g['target']}): {'met' if g['met'] else 'missed'}"
              for g in report["goals"]),
            f"Smallest size reaching {settings.bound_share:.0%} of the bound: "
            f"{details['smallest_size_reaching_bound_share']}"]


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
    chart = LineChart(CHART, "Prefix hit ratio against cache size (second half of the trace)",
                      "cache size (trace blocks)", "hit ratio", sizes, series)
    tables = [_table(report, settings), _tuning_table(report, settings)]
    if "engine_replay" in report:
        tables.append(_engine_table(report["engine_replay"]))
    write_report(out_dir, report, "bench kv-cache", tables, chart, _notes(report, settings))
