"""Figures per variant: observation tokens saved, answers kept, continuations that stay the same.

- hidden_ratio: 1 - (observation tokens the answer's first token attends to under the variant) / (observation
  tokens under full), summed over transcripts; a tool message's tokens include its template markers. Under
  `query` and `attention` what the engine's picks read (the mean over layers of the last prefill chunk's).
- compute_saved_ratio: observation tokens neither prefilled again nor attended to, over full's. The engine
  reads only what is attended (a skipped block costs neither reads nor FLOPs), and no variant here prefills an
  observation again without attending to it (dropping's re-prefilled last K are attended), so it equals
  hidden_ratio; it is kept apart because a variant that did (a cache miss, a rewrite) would save less.
- prefill_saved_ratio (what compute_saved_ratio meant before issue 50): 1 - (observation tokens in the
  variant's prompt) / (observation tokens under full): those never prefilled at all (pruned, dropped).
- accuracy: share of transcripts whose answer holds the expected string (`answers.mentions`).
- answer_retention: of the transcripts full answers correctly, the share the variant answers correctly too.
- continuation_agreement: share of transcripts whose first 16 generated tokens equal full's.
- mean_token_agreement: mean over transcripts of the share of the first 16 positions where the variant's
  token equals full's; a position only one of them reached (the other stopped) counts as a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agents_eval.bench.quality.transcripts import Transcript
from agents_eval.harness.report import goal

AGREEMENT_TOKENS = 16
GOAL_HIDDEN = 0.30  # the observation tokens a variant keeps out of the answer's attention
GOAL_COMPUTE_SAVED = 0.30  # the observation tokens it neither prefills again nor attends to
GOAL_ANSWER_RETENTION = 0.95
GOAL_OVER_DROPPED = 0.15  # retention points over text-level dropping at the same compute saved
REFERENCE = "full"
DROPPED = "dropped"


@dataclass(frozen=True)
class Outcome:
    """One transcript under one variant: what the model answered, and the observation tokens it saw."""

    text: str
    token_ids: list[int]
    observation_tokens: int
    attended_observation_tokens: float  # a mean over layers where the engine picked per layer
    correct: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache already held (computed by an earlier variant)
    asked_read: float | None = None  # under the engine's picks: the share of the asked observation read


@dataclass(frozen=True)
class TranscriptResult:
    transcript: Transcript
    outcomes: dict[str, Outcome]  # by variant name
    keep_last: int  # the masks' K

    @property
    def reach(self) -> str:
        """How old the observation asked about is: `age_0` the last one, `age_9` the first of ten."""
        return f"age_{self.transcript.age}"

    @property
    def window(self) -> str:
        """Whether the observation asked about is among the last K (masks and dropping keep it) or older."""
        return "within_last_k" if self.transcript.age < self.keep_last else "beyond_last_k"


def token_agreement(ids: Sequence[int], reference: Sequence[int], n: int = AGREEMENT_TOKENS) -> float:
    own, ref = list(ids[:n]), list(reference[:n])
    length = max(len(own), len(ref))
    if length == 0:
        return 1.0
    return sum(1 for a, b in zip(own, ref, strict=False) if a == b) / length


def _share(count: int, total: int) -> float | None:
    return count / total if total else None


def variant_figures(results: Sequence[TranscriptResult], variant: str) -> dict[str, Any]:
    """Over the transcripts run under the variant (screened: those full answers, for every variant but full)."""
    results = [r for r in results if variant in r.outcomes]
    full_tokens = sum(r.outcomes[REFERENCE].observation_tokens for r in results)
    attended = sum(r.outcomes[variant].attended_observation_tokens for r in results)
    in_prompt = sum(r.outcomes[variant].observation_tokens for r in results)
    answered = [r for r in results if r.outcomes[REFERENCE].correct]
    retained = sum(1 for r in answered if r.outcomes[variant].correct)
    pairs = [(r.outcomes[variant].token_ids, r.outcomes[REFERENCE].token_ids) for r in results]
    same = sum(1 for own, ref in pairs if own[:AGREEMENT_TOKENS] == ref[:AGREEMENT_TOKENS])
    agreements = [token_agreement(own, ref) for own, ref in pairs]
    return {
        "hidden_ratio": None if not full_tokens else 1 - attended / full_tokens,
        "compute_saved_ratio": None if not full_tokens else 1 - attended / full_tokens,
        "prefill_saved_ratio": None if not full_tokens else 1 - in_prompt / full_tokens,
        "answer_retention": _share(retained, len(answered)),
        "continuation_agreement": _share(same, len(results)),
        "mean_token_agreement": sum(agreements) / len(agreements) if agreements else None,
        "accuracy": _share(sum(1 for r in results if r.outcomes[variant].correct), len(results)),
        "transcripts": len(results),
        "correct": sum(1 for r in results if r.outcomes[variant].correct),
        "answered_by_full": len(answered),
        "retained": retained,
        "observation_tokens_full": full_tokens,
        "observation_tokens_attended": attended,
        "observation_tokens_in_prompt": in_prompt,
        "prompt_tokens": sum(r.outcomes[variant].prompt_tokens for r in results),
        "cached_prompt_tokens": sum(r.outcomes[variant].cached_tokens for r in results),
    }


def verdict(figures: dict[str, Any]) -> dict[str, Any]:
    """Whether the variant hides at least 30% of observation tokens, saves the compute of at least 30%, and
    keeps at least 95% of the answers, and by how much it falls short of each (0 when met; None when nothing
    was answered under full)."""
    hidden, saved, retention = figures["hidden_ratio"], figures["compute_saved_ratio"], figures["answer_retention"]
    hidden_short = GOAL_HIDDEN if hidden is None else max(0.0, GOAL_HIDDEN - hidden)
    saved_short = GOAL_COMPUTE_SAVED if saved is None else max(0.0, GOAL_COMPUTE_SAVED - saved)
    retention_short = None if retention is None else max(0.0, GOAL_ANSWER_RETENTION - retention)
    return {"met": hidden_short == 0 and saved_short == 0 and retention_short == 0,
            "hidden_short_by": hidden_short, "compute_saved_short_by": saved_short,
            "answer_retention_short_by": retention_short}


def variant_goals(variant: str, figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The variant's three checks, in the harness's goal shape."""
    checks = [("observation tokens hidden from the answer", GOAL_HIDDEN, figures["hidden_ratio"]),
              ("observation tokens neither prefilled again nor attended", GOAL_COMPUTE_SAVED,
               figures["compute_saved_ratio"]),
              ("answer retention", GOAL_ANSWER_RETENTION, figures["answer_retention"])]
    return [goal(f"{variant}: {name}", target, "min", measured) for name, target, measured in checks]


def dropped_retention_at(saved: float, dropped: dict[str, Any]) -> float | None:
    """Dropping's retention at this compute saved, drawn on the line from full (nothing saved, everything kept)
    to dropping's own point: questions are spread evenly over the observations, so dropping fewer of them loses
    answers in proportion. Beyond dropping's own saving, its own retention."""
    own_saved, own_retention = dropped["compute_saved_ratio"], dropped["answer_retention"]
    if own_saved is None or own_retention is None or own_saved <= 0:
        return own_retention
    return 1 - min(saved / own_saved, 1.0) * (1 - own_retention)


def headline_goals(variants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's two goals: a variant keeping >= 95% of full's answers while saving >= 30% of observation
    tokens' attention; and >= 15 points more retention than dropping at equal savings (the best such variant)."""
    saving = {v: f for v, f in variants.items() if v not in (REFERENCE, DROPPED)
              and (f["compute_saved_ratio"] or 0) >= GOAL_COMPUTE_SAVED and f["answer_retention"] is not None}
    best = max(saving, key=lambda v: saving[v]["answer_retention"], default=None)
    margins = {}
    for v, f in saving.items():
        at = dropped_retention_at(f["compute_saved_ratio"], variants[DROPPED])
        if at is not None:
            margins[v] = f["answer_retention"] - at
    ahead = max(margins, key=lambda v: margins[v], default=None)
    return [goal("answer retention of the best variant saving >= 30% of observation tokens' attention",
                 GOAL_ANSWER_RETENTION, "min", None if best is None else saving[best]["answer_retention"],
                 variant=best),
            goal("retention points over dropped at equal compute saved", GOAL_OVER_DROPPED, "min",
                 None if ahead is None else margins[ahead], variant=ahead)]


def breakdown(results: Sequence[TranscriptResult], variant: str,
              key: Callable[[TranscriptResult], str], groups: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {group: variant_figures([r for r in results if key(r) == group], variant) for group in groups}
