"""The table's DistServe row as multi-turn deployments run it: prefix caching on the prefill workers and routing
to the prefill worker holding the session's history, so a session's later turns prefill only their new tokens;
the no-cache ablation step recomputes the whole history every turn."""

from __future__ import annotations

import statistics

from agents_eval.sim.model.config import ClusterConfig, cluster_config
from agents_eval.sim.run import simulate
from agents_eval.sim.workload import draw_sessions


def _two_of_each(name: str) -> ClusterConfig:
    """The named deployment cut to 2 prefill and 2 decode nodes."""
    base = cluster_config(name)
    return base.model_copy(update={"pools": tuple(p.model_copy(update={"nodes": 2}) for p in base.pools)})


def _computed_by_turn(name: str) -> dict[str, list[tuple[int, int]]]:
    """Per session, in turn order: (prompt tokens, prompt tokens its workers computed)."""
    cluster, _ = simulate(_two_of_each(name), draw_sessions("swe", seed=3, rate=0.3, duration_s=20))
    turns: dict[str, list[tuple[float, int, int]]] = {}
    for r in cluster.log.requests:
        assert r.prefill_worker is not None  # every turn prefilled remotely, as DistServe does
        turns.setdefault(r.session_id, []).append((r.arrival_s, r.prompt_tokens, r.computed_prompt_tokens))
    return {s: [(p, c) for _, p, c in sorted(rows)] for s, rows in turns.items()}


def test_prefill_tokens_per_turn_fall_after_the_first_turn() -> None:
    sessions = _computed_by_turn("moe27b-distserve")
    assert len(sessions) >= 3 and all(len(turns) >= 3 for turns in sessions.values())
    first = statistics.mean(turns[0][1] for turns in sessions.values())
    later = [computed for turns in sessions.values() for _, computed in turns[1:]]
    later_prompts = [prompt for turns in sessions.values() for prompt, _ in turns[1:]]
    assert statistics.mean(later) < first < statistics.mean(later_prompts)
    # the history is reused: a later turn computes well under half of its prompt
    assert sum(later) < 0.5 * sum(later_prompts)


def test_the_no_cache_ablation_recomputes_every_history() -> None:
    sessions = _computed_by_turn("moe27b-distserve-nocache")
    assert all(computed == prompt for turns in sessions.values() for prompt, computed in turns)
