"""The quality benchmark's report: `report.json` (every figure and every answer), `report.md` (tables) and
`retention_vs_saved.png` (answer retention against observation tokens saved, one point per variant)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agents_eval.bench.quality.scoring import (
    GOAL_ANSWER_RETENTION,
    GOAL_COMPUTE_SAVED,
    GOAL_HIDDEN,
    REFERENCE,
    TranscriptResult,
    breakdown,
    headline_goals,
    variant_figures,
    variant_goals,
    verdict,
)
from agents_eval.bench.quality.tool_questions import KINDS
from agents_eval.bench.quality.transcripts import OBSERVATIONS, POSITIONS
from agents_eval.bench.quality.variants import VARIANTS
from agents_eval.harness.report import JSON_NAME, MARKDOWN_NAME, Table, markdown_document

CHART_NAME = "retention_vs_saved.png"
WINDOWS = ("within_last_k", "beyond_last_k")
REACHES = tuple(f"age_{age}" for age in range(OBSERVATIONS))


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    chart: Path


def variant_section(results: Sequence[TranscriptResult], variant: str) -> dict[str, Any]:
    figures = variant_figures(results, variant)
    return figures | {
        "goal": verdict(figures),
        "by_kind": breakdown(results, variant, lambda r: r.transcript.kind, KINDS),
        "by_position": breakdown(results, variant, lambda r: r.transcript.position, POSITIONS),
        "by_reach": breakdown(results, variant, lambda r: r.reach, REACHES),
        "by_window": breakdown(results, variant, lambda r: r.window, WINDOWS),
    }


def transcript_entry(result: TranscriptResult) -> dict[str, Any]:
    t = result.transcript
    return {"index": t.index, "kind": t.kind, "subkind": t.observations[t.target].subkind, "position": t.position,
            "age": t.age, "reach": result.reach, "window": result.window, "observations": len(t.observations),
            "question": t.question, "answer": t.answer,
            "variants": {v: {"text": o.text, "token_ids": o.token_ids, "correct": o.correct,
                             "observation_tokens": o.observation_tokens,
                             "attended_observation_tokens": o.attended_observation_tokens,
                             "prompt_tokens": o.prompt_tokens, "cached_tokens": o.cached_tokens,
                             "asked_observation_read": o.asked_read}
                         for v, o in result.outcomes.items()}}


def report_json(results: Sequence[TranscriptResult], head: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    variants = {v: variant_section(results, v) for v in VARIANTS}
    return head | {
        "goal": {"min_hidden_ratio": GOAL_HIDDEN, "min_compute_saved_ratio": GOAL_COMPUTE_SAVED,
                 "min_answer_retention": GOAL_ANSWER_RETENTION},
        "variants": variants,
        "goals": headline_goals(variants) + [g for v in VARIANTS if v != REFERENCE
                                             for g in variant_goals(v, variants[v])],
        "transcripts": [transcript_entry(r) for r in results],
    } | end


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _verdict(section: dict[str, Any]) -> str:
    verdict = section["goal"]
    if verdict["met"]:
        return "met"
    misses = []
    if verdict["hidden_short_by"]:
        misses.append(f"hides {100 * verdict['hidden_short_by']:.1f} pp too few")
    if verdict["compute_saved_short_by"]:
        misses.append(f"saves the compute of {100 * verdict['compute_saved_short_by']:.1f} pp too few")
    if verdict["answer_retention_short_by"] is None:
        misses.append("retention not measurable (full answered none)")
    elif verdict["answer_retention_short_by"]:
        misses.append(f"retention {100 * verdict['answer_retention_short_by']:.1f} pp short")
    return "missed: " + ", ".join(misses)


def _group_table(title: str, report: dict[str, Any], section: str, groups: Sequence[str]) -> Table:
    rows = []
    for group in groups:
        cells = [report["variants"][v][section][group] for v in VARIANTS]
        rows.append([group, str(cells[0]["transcripts"]),
                     *[f"{_pct(c['accuracy'])} / {_pct(c['answer_retention'])}" for c in cells]])
    return Table(title, ["asked about", "transcripts", *VARIANTS], rows)


def tables(report: dict[str, Any]) -> list[Table]:
    variants = report["variants"]
    summary = [[v, _pct(s["hidden_ratio"]), _pct(s["compute_saved_ratio"]), _pct(s["prefill_saved_ratio"]),
                _pct(s["answer_retention"]),
                _pct(s["continuation_agreement"]),
                _pct(s["mean_token_agreement"]), _pct(s["accuracy"]), f"{s['retained']}/{s['answered_by_full']}",
                _verdict(s)] for v, s in variants.items()]
    headers = ["variant", "hidden", "compute saved", "never prefilled", "answer retention", "continuation agreement",
               "mean token agreement", "accuracy", "kept/answered by full",
               "goal (>=30% hidden, >=30% compute saved, >=95% retained)"]
    return [Table("Variants", headers, summary),
            _group_table("Accuracy / answer retention by kind of observation asked about", report, "by_kind", KINDS),
            _group_table("Accuracy / answer retention by position of that observation", report, "by_position",
                         POSITIONS),
            _group_table("Accuracy / answer retention by reach (age_N: N observations came after it)", report,
                         "by_reach", REACHES),
            _group_table("Accuracy / answer retention by window (K = masks' kept observations)", report, "by_window",
                         WINDOWS),
            Table("Goals", ["goal", "target", "measured", "variant", "met"],
                  [[g["name"], str(g["target"]), "n/a" if g["measured"] is None else f"{g['measured']:.3f}",
                    str(g.get("variant", "")), "met" if g["met"] else "missed"] for g in report["goals"][:2]])]


def notes(report: dict[str, Any]) -> list[str]:
    settings, policy = report["settings"], report["policies"]
    return [f"{len(report['transcripts'])} transcripts (seed {settings['seed']}) on `{settings['model']}`, greedy, up "
            f"to {settings['max_tokens']} tokens per answer; K = {policy['keep_last_tool_observations']} (masks "
            f"and dropping keep the last K tool observations); {report['bench_wall_s']:.0f} s in all.",
            "Hidden: observation tokens (tool messages, template markers included) the answer's first token does "
            "not attend to (pruned, masked, skipped by the engine's picks, or dropped), over those under full. "
            "Compute saved: those neither prefilled again nor attended to (here the same: the engine reads only "
            "what is attended). Never prefilled: those not in the prompt at all (pruned or dropped; the meaning "
            "of compute saved before issue 50). Answer retention: of the "
            "transcripts full answers correctly, the share the "
            "variant answers correctly. Continuation agreement: first 16 generated tokens equal to full's.",
            "Screened: " + ("every variant but full ran only on the transcripts full answers, so their "
                            "figures are over those" if settings.get("screen") else "no; every variant ran on every "
                            "transcript") + ".",
            "Cells of the breakdown tables: accuracy / answer retention. `beyond_last_k`: the question's answer is "
            "in an observation that masks hide and dropping removes, by design."]


def save_chart(report: dict[str, Any], path: Path) -> None:
    figure = Figure(figsize=(7, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.axvspan(GOAL_COMPUTE_SAVED, 1.0, ymin=GOAL_ANSWER_RETENTION / 1.05, ymax=1.0, color="tab:green",
                 alpha=0.15, label="goal")
    for variant, section in report["variants"].items():
        saved, retention = section["compute_saved_ratio"] or 0.0, section["answer_retention"]
        if retention is not None:
            axes.scatter([saved], [retention], s=60, label=f"{variant} ({100 * saved:.0f}%, {100 * retention:.0f}%)")
    axes.set_xlim(-0.02, 1.0)
    axes.set_ylim(0, 1.05)
    axes.set_xlabel("observation tokens neither prefilled again nor attended (compute saved, share of full)")
    axes.set_ylabel("answer retention (share of full's correct answers)")
    axes.set_title(f"History handling on {report['settings']['model']}: answers kept vs tokens saved")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower left", title="variant (saved, retained)")
    figure.savefig(path, dpi=120)


def write(out_dir: Path, report: dict[str, Any]) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir / JSON_NAME, out_dir / MARKDOWN_NAME, out_dir / CHART_NAME)
    files.json.write_text(json.dumps(report, indent=2) + "\n")
    files.markdown.write_text(markdown_document("agentserve quality benchmark: pruning and history policies",
                                                tables(report), notes(report)))
    save_chart(report, files.chart)
    return files
