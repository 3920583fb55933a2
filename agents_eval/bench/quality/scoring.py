"""Figures per variant: observation tokens saved, answers kept, continuations that stay the same.

- hidden_ratio: 1 - (observation tokens the answer attends to under the variant) / (observation tokens
  under full), summed over transcripts; a tool message's tokens include its template markers. Masked tokens
  count as hidden, though they were prefilled, are held in the KV cache and were read by earlier turns.
- compute_saved_ratio: 1 - (observation tokens in the variant's prompt) / (observation tokens under full):
  what is neither prefilled nor attended to (pruned away, or dropped for a placeholder). A masked token
  saves attention reads from the turn it is masked on, never its prefill, so masks alone save none of it.
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

AGREEMENT_TOKENS = 16
GOAL_HIDDEN = 0.30  # the observation tokens a variant keeps out of the answer's attention
GOAL_COMPUTE_SAVED = 0.30  # the observation tokens it neither prefills nor attends to
GOAL_ANSWER_RETENTION = 0.95
REFERENCE = "full"


@dataclass(frozen=True)
class Outcome:
    """One transcript under one variant: what the model answered, and the observation tokens it saw."""

    text: str
    token_ids: list[int]
    observation_tokens: int
    attended_observation_tokens: int
    correct: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache already held (computed by an earlier variant)


@dataclass(frozen=True)
class TranscriptResult:
    transcript: Transcript
    outcomes: dict[str, Outcome]  # by variant name
    keep_last: int  # the masks' K

    @property
    def reach(self) -> str:
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
        "compute_saved_ratio": None if not full_tokens else 1 - in_prompt / full_tokens,
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


def goal(figures: dict[str, Any]) -> dict[str, Any]:
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


def goal_list(variant: str, figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The variant's three goals as report objects: name, target, bound, measured, met."""
    checks = [("observation tokens hidden from the answer", GOAL_HIDDEN, figures["hidden_ratio"]),
              ("observation tokens neither prefilled nor attended", GOAL_COMPUTE_SAVED, figures["compute_saved_ratio"]),
              ("answer retention", GOAL_ANSWER_RETENTION, figures["answer_retention"])]
    return [{"name": f"{variant}: {name}", "target": target, "bound": "min", "measured": measured,
             "met": measured is not None and measured >= target} for name, target, measured in checks]


def breakdown(results: Sequence[TranscriptResult], variant: str,
              key: Callable[[TranscriptResult], str], groups: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {group: variant_figures([r for r in results if key(r) == group], variant) for group in groups}
