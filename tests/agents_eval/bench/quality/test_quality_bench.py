"""The quality benchmark: its transcripts (seeded, answerable, with prunable redundancy), its answer check
and agreement measure, and the bench on three transcripts on SmolLM2 with every figure recounted by hand."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents_eval.bench.quality import QualityBenchSettings, QualityResult, bench, run_benchmark
from agents_eval.bench.quality import report as quality_report
from agents_eval.bench.quality.answers import mentions
from agents_eval.bench.quality.scoring import dropped_retention_at, headline_goals, token_agreement
from agents_eval.bench.quality.transcripts import Transcript, generate_transcripts
from agentserve.cli import EXIT_BAD_INPUT, main
from engine.model.loader import builtin_gguf, load_tokenizer
from engine.model.tokenizer import Tokenizer
from trajectory.pruning.prune import PruningConfig, prune
from trajectory.settings import TrajectorySettings

VARIANTS = ("full", "pruned", "age", "pruned+age", "query", "pruned+query", "attention", "pruned+attention", "dropped")
PICKING = ("query", "pruned+query", "attention", "pruned+attention")
# Seed 0's first three transcripts, read off their text: (kind, position, observations, asked, answer).
EXPECTED = [("listing", "older", 10, 0, "fix/inventory-733"),
            ("log", "older", 10, 1, "1437"),
            ("tree", "older", 10, 2, "555-1038")]


def _holds(text: str, answer: str) -> bool:
    """The answer in the text, lower-cased and without backticks, not glued to letters or digits."""
    return re.search(rf"(?<![a-z0-9]){re.escape(answer.lower())}(?![a-z0-9])", text.lower().replace("`", "")) \
        is not None


def _contents(transcript: Transcript) -> str:
    return "\n".join(m.content for group in transcript.message_groups() for m in group)


def test_same_seed_same_transcripts_other_seed_others() -> None:
    assert generate_transcripts(30, seed=7) == generate_transcripts(30, seed=7)
    assert [_contents(t) for t in generate_transcripts(30, seed=7)] != \
        [_contents(t) for t in generate_transcripts(30, seed=8)]


def test_hundred_transcripts_each_answer_only_in_the_observation_asked_about() -> None:
    transcripts = generate_transcripts(100, seed=0)
    assert len(transcripts) == 100
    for t in transcripts:
        messages = [m for group in t.message_groups() for m in group]
        asked = [m for m in messages if m.role == "tool"][t.target]
        assert t.answer in asked.content
        others = [m.content for m in messages if m is not asked]
        assert not any(_holds(text, t.answer) for text in others), t.index
    assert all(len(t.observations) == 10 for t in transcripts)
    assert len({(t.kind, t.target) for t in transcripts}) == 40  # every kind asked at every position
    assert all(sum(t.target == target for t in transcripts) == 10 for target in range(10))  # evenly over them


def test_calls_and_results_pair_up_as_function_calling() -> None:
    for t in generate_transcripts(20, seed=1):
        groups = t.message_groups()
        assert [m.role for m in groups[0]] == ["system", "user"] and [m.role for m in groups[-1]] == ["user"]
        for assistant, tool in groups[1:-1]:
            [call] = assistant.tool_calls or []
            assert tool.role == "tool" and tool.tool_call_id == call["id"] and tool.name == call["function"]["name"]
            json.loads(call["function"]["arguments"])


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Tokenizer:
    return load_tokenizer(builtin_gguf("smollm2"))


def _count(tokenizer: Tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer.encode(text))


@pytest.mark.slow
def test_pruning_finds_redundancy_in_text_and_leaves_json(smollm2_tokenizer: Tokenizer) -> None:
    config, count = PruningConfig.load(), _count(smollm2_tokenizer)
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    for t in generate_transcripts(100, seed=0):
        for o in t.observations:
            result = prune(o.text, "tool", o.tool, config, count)
            before[o.kind] = before.get(o.kind, 0) + result.tokens_before
            after[o.kind] = after.get(o.kind, 0) + result.tokens_after
    saved = {kind: 1 - after[kind] / before[kind] for kind in before}
    assert saved["json"] == 0
    assert 0 < saved["listing"] < 0.1 and all(0.05 < saved[kind] < 0.5 for kind in ("log", "tree")), saved
    full_tokens = [sum(count(m.content) for g in t.message_groups() for m in g) for t in generate_transcripts(100, 0)]
    # ten observations a transcript: ~1.6k tokens of messages (seed 0: 1,460 to 1,840), well inside 8k contexts
    assert min(full_tokens) >= 1200 and max(full_tokens) <= 2400 and 1400 <= sum(full_tokens) / 100 <= 1900


def test_answer_check_wants_the_whole_value() -> None:
    assert mentions("The file is `queries.py`.", "queries.py")
    assert mentions("src/billing/queries.py", "queries.py")
    assert mentions("Id: 49", "49") and not mentions("149", "49") and not mentions("id 490", "49")
    assert mentions("com.shop.search.RefundConflictException", "RefundConflictException")
    assert not mentions("RefundConflict", "RefundConflictException")


def test_token_agreement_counts_positions_up_to_sixteen() -> None:
    assert token_agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert token_agreement([1, 9, 3, 4], [1, 2, 3, 4]) == 0.75
    assert token_agreement([1, 2], [1, 2, 3, 4]) == 0.5  # stopped early: the missing positions disagree
    assert token_agreement([*range(16), 99], [*range(16), 7]) == 1.0  # only the first 16 count
    assert token_agreement([], []) == 1.0


@pytest.mark.parametrize(("args", "message"), [(["--transcripts", "0"], "--transcripts"),
                                               (["--variants", "age", "sparse"], "unknown sparse"),
                                               (["--indices", "3", "-1"], "--indices")])
def test_cli_rejects_bad_settings_before_loading_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "quality", "--out", str(tmp_path), *args])
    assert exit_info.value.code == EXIT_BAD_INPUT and message in capsys.readouterr().err


def test_indices_take_those_of_the_seeds_transcripts_in_order() -> None:
    every = generate_transcripts(8, seed=0)
    picked = bench._transcripts(QualityBenchSettings(indices=(7, 2, 7)))
    assert [t.index for t in picked] == [2, 7] and picked == [every[2], every[7]]


SCREENED_OUT = {1, 2}  # the fixture's screen lets transcript 0 alone through, whatever full answered


@dataclass
class Screened:
    result: QualityResult
    written: list[tuple[bool, int]]  # each report written: (partial, transcripts in it)


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Screened:
    written: list[tuple[bool, int]] = []
    write = quality_report.write

    def recording_write(out: Path, report: dict[str, Any]) -> quality_report.ReportFiles:
        written.append((report["partial"], len(report["transcripts"])))
        return write(out, report)

    settings = QualityBenchSettings(model="smollm2", transcripts=3, seed=0, batch=2, num_threads=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench, "full_answers", lambda answer, transcript: transcript.index not in SCREENED_OUT)
        patch.setattr(quality_report, "write", recording_write)
        return Screened(run_benchmark(settings, tmp_path_factory.mktemp("quality-bench")), written)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_screening_runs_the_other_variants_only_where_full_answers(three: Screened) -> None:
    # screen batches [0, 1] and [2] (each ends a screened-out transcript), then the variants' batch [0], the end
    assert three.written == [(True, 1), (True, 2), (True, 3), (False, 3)]
    report = three.result.report
    assert [set(t["variants"]) for t in report["transcripts"]] == [set(VARIANTS), {"full"}, {"full"}]
    assert report["variants"]["full"]["transcripts"] == 3
    assert all(report["variants"][v]["transcripts"] == 1 for v in VARIANTS if v != "full")
    assert report["settings"]["screen"] is True and report["partial"] is False


def _tool_block(content: str) -> str:
    """SmolLM2's chat template writes a tool message as a ChatML block with the content verbatim."""
    return f"<|im_start|>tool\n{content}<|im_end|>\n"


def _hand_counts(t: Transcript, count: Callable[[str], int], keep: int) -> dict[str, tuple[int, int]]:
    """Per variant: (observation tokens in the prompt, of which the answer attends to)."""
    config = PruningConfig.load()
    full = [count(_tool_block(o.text)) for o in t.observations]
    pruned = [count(_tool_block(prune(o.text, "tool", o.tool, config, count).text)) for o in t.observations]
    old = len(t.observations) - keep
    dropped = [count(_tool_block(f"Old environment output: ({len(o.text.splitlines())} lines omitted)"))
               if i < old else full[i] for i, o in enumerate(t.observations)]
    return {"full": (sum(full), sum(full)), "pruned": (sum(pruned), sum(pruned)),
            "age": (sum(full), sum(full[old:])), "pruned+age": (sum(pruned), sum(pruned[old:])),
            "query": (sum(full), sum(full[old:])), "pruned+query": (sum(pruned), sum(pruned[old:])),
            "attention": (sum(full), sum(full[old:])), "pruned+attention": (sum(pruned), sum(pruned[old:])),
            "dropped": (sum(dropped), sum(dropped))}


def test_the_two_goals_take_the_best_variant_and_dropping_at_equal_savings() -> None:
    def figures(saved: float, retention: float | None) -> dict[str, Any]:
        return {"compute_saved_ratio": saved, "answer_retention": retention}
    variants = {"full": figures(0.0, 1.0), "pruned": figures(0.09, 1.0), "query": figures(0.45, 0.9),
                "attention": figures(0.5, 0.8), "dropped": figures(0.7, 0.3)}
    assert dropped_retention_at(0.35, variants["dropped"]) == pytest.approx(0.65)  # halfway to dropping's point
    assert dropped_retention_at(0.9, variants["dropped"]) == pytest.approx(0.3)
    best, ahead = headline_goals(variants)
    assert (best["variant"], best["measured"], best["met"]) == ("query", 0.9, False)  # pruned saves under 30%
    assert ahead["variant"] == "query" and ahead["measured"] == pytest.approx(0.9 - (1 - 0.45 / 0.7 * 0.7))
    assert ahead["met"] and {"name", "target", "bound", "measured", "met"} <= set(best)
    none_saving = headline_goals({"full": figures(0.0, 1.0), "pruned": figures(0.1, 1.0), "dropped": figures(0.7, 0.3)})
    assert [g["measured"] for g in none_saving] == [None, None] and not any(g["met"] for g in none_saving)




@pytest.mark.slow
@pytest.mark.timeout(3600)  # three transcripts of ten observations, five variants, on SmolLM2 (a busy host: 600 s+)
def test_three_transcripts_every_figure_recounted(three: Screened, smollm2_tokenizer: Tokenizer) -> None:
    report = json.loads(three.result.files.json.read_text())
    keep = TrajectorySettings().masks.keep_last_tool_observations
    transcripts = generate_transcripts(3, seed=0)
    entries = report["transcripts"]
    for t, entry, (kind, position, count, asked, answer) in zip(transcripts, entries, EXPECTED, strict=True):
        assert (t.kind, t.position, len(t.observations), t.target, t.answer) == (kind, position, count, asked, answer)
        assert (entry["kind"], entry["position"], entry["answer"]) == (kind, position, answer)
        for variant, (seen, attended) in _hand_counts(t, _count(smollm2_tokenizer), keep).items():
            if variant not in entry["variants"]:  # screened out: full alone
                continue
            outcome = entry["variants"][variant]
            assert outcome["observation_tokens"] == seen
            if variant in PICKING:  # the engine's picks: the last K observations always, at most all of them
                # (one run read everything for transcript 0 under pruned+query: its last chunk did not pick)
                assert attended <= outcome["attended_observation_tokens"] <= seen
            else:
                assert outcome["attended_observation_tokens"] == attended
            assert outcome["correct"] == _holds(outcome["text"], answer)
    for variant in VARIANTS:
        ran = [e for e in entries if variant in e["variants"]]
        _check_variant(report["variants"][variant], [e["variants"][variant] for e in ran],
                       [e["variants"]["full"] for e in ran])


def _check_variant(figures: dict[str, Any], own: list[dict[str, Any]], full: list[dict[str, Any]]) -> None:
    full_tokens = sum(f["observation_tokens"] for f in full)
    hidden = 1 - sum(o["attended_observation_tokens"] for o in own) / full_tokens
    assert figures["hidden_ratio"] == pytest.approx(hidden)
    never_prefilled = 1 - sum(o["observation_tokens"] for o in own) / full_tokens
    assert figures["prefill_saved_ratio"] == pytest.approx(never_prefilled)
    saved = hidden  # nothing here is prefilled again without being attended
    assert figures["compute_saved_ratio"] == pytest.approx(saved)
    answered = [i for i, f in enumerate(full) if f["correct"]]
    retention = sum(own[i]["correct"] for i in answered) / len(answered) if answered else None
    assert figures["answer_retention"] == (pytest.approx(retention) if answered else None)
    assert figures["accuracy"] == pytest.approx(sum(o["correct"] for o in own) / len(own))
    same = [o["token_ids"][:16] == f["token_ids"][:16] for o, f in zip(own, full, strict=True)]
    assert figures["continuation_agreement"] == pytest.approx(sum(same) / len(own))
    shares = []
    for o, f in zip(own, full, strict=True):
        a, b = o["token_ids"][:16], f["token_ids"][:16]
        shares.append(sum(x == y for x, y in zip(a, b, strict=False)) / max(len(a), len(b), 1))
    assert figures["mean_token_agreement"] == pytest.approx(sum(shares) / len(own))
    met = hidden >= 0.3 and saved >= 0.3 and retention is not None and retention >= 0.95
    assert figures["goal"]["met"] == met


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_three_transcripts_saving_order_and_report_files(three: Screened) -> None:
    result = three.result
    variants = result.report["variants"]
    hidden = {v: variants[v]["hidden_ratio"] for v in VARIANTS}
    assert hidden["full"] == 0 and 0 < hidden["pruned"] < hidden["pruned+age"]
    assert hidden["age"] < hidden["pruned+age"] and 0 < hidden["dropped"] < hidden["age"]
    assert all(0 < hidden[v] < hidden["age"] for v in PICKING)  # about half the history read, the last K always
    never = {v: variants[v]["prefill_saved_ratio"] for v in VARIANTS}
    assert never["full"] == never["age"] == never["query"] == never["attention"] == 0  # prefilled, held
    assert never["pruned"] == pytest.approx(never["pruned+age"]) == pytest.approx(never["pruned+query"])
    assert never["dropped"] == pytest.approx(hidden["dropped"])
    goals = result.report["goals"]
    headline, per_variant = goals[:2], goals[2:]
    assert {g["name"].split(":")[0] for g in per_variant} == set(VARIANTS) - {"full"}
    assert len(per_variant) == 3 * (len(VARIANTS) - 1) and headline[1]["target"] == 0.15
    assert all({"name", "target", "bound", "measured", "met"} <= set(g) and g["bound"] == "min" for g in goals)
    assert variants["full"]["continuation_agreement"] == 1.0
    assert variants["age"]["continuation_agreement"] < 1.0  # the masks reach the engine's attention
    markdown = result.files.markdown.read_text()
    assert all(f"| {v} |" in markdown for v in VARIANTS)
    assert "goal (>=30% hidden, >=30% compute saved, >=95% retained)" in markdown
    assert result.files.chart.read_bytes().startswith(b"\x89PNG")
