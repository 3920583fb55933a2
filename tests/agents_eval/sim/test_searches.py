"""The table's and the placement search's rate searches in processes of their own give the rows one process gives
(the runs are seeded), and a search's run ends once its judged requests are done, with the same figures."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from agents_eval.sim.experiments import Load, placement_search, slo_table
from agents_eval.sim.jobs import describe, in_processes, resources
from agents_eval.sim.model.config import ClusterConfig, cluster_config
from agents_eval.sim.run import Window, simulate
from agents_eval.sim.workload import draw_sessions
from engine.core.slo import SloClass

TINY = Load("swe", warmup_s=4.0, duration_s=10.0, seed=2)


def _one_node_each(name: str) -> ClusterConfig:
    """The named deployment on a node of each kind, judged by a TTFT of 0.1 s: its searches end within 8 sessions/s."""
    base = cluster_config(name)
    return base.model_copy(update={"pools": tuple(p.model_copy(update={"nodes": 1}) for p in base.pools),
                                   "slo": SloClass(ttft_s=0.1, tpot_s=0.1)})


def _without_cpu(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "cpu_s"} for row in rows]


def test_the_table_in_two_processes_gives_the_rows_of_one() -> None:
    configs = [_one_node_each("moe27b-colocated"), _one_node_each("moe27b-distserve")]
    alone = slo_table(configs, TINY, start_rate=1.0, steps=1, jobs=1)
    parallel = slo_table(configs, TINY, start_rate=1.0, steps=1, jobs=2)
    assert [row["configuration"] for row in parallel] == ["moe27b-colocated", "moe27b-distserve"]
    assert all(row["points"] and row["cpu_s"] > 0 for row in parallel)
    assert _without_cpu(parallel) == _without_cpu(alone)


def test_the_placement_search_in_two_processes_gives_the_rows_of_one() -> None:
    base = _one_node_each("moe27b-distserve")
    configs = [base, base.model_copy(update={"pools": (base.pools[0], base.pools[1].model_copy(
        update={"tensor_parallel": 4})), "name": "decode at tp4"})]
    alone = placement_search(configs, TINY, start_rate=1.0, steps=0, jobs=1)
    assert _without_cpu(placement_search(configs, TINY, start_rate=1.0, steps=0, jobs=2)) == _without_cpu(alone)


def test_a_run_ended_once_its_judged_requests_are_done_has_the_same_figures() -> None:
    config, window = cluster_config("moe27b-agent"), Window(5.0, 15.0)
    sessions = draw_sessions("swe", seed=4, rate=0.5, duration_s=15.0)
    cut_cluster, cut = simulate(config, sessions, window, until_judged=True)
    full_cluster, full = simulate(config, sessions, window)
    assert cut_cluster.env.now < full_cluster.env.now  # the sessions' later turns were not played
    judged = [r for r in cut_cluster.log.requests if r.arrival_s < window.end_s]
    assert max(r.last_token_s or 0 for r in judged) == cut_cluster.env.now
    assert cut.steps < full.steps
    assert asdict(replace(cut, steps=0, role_changes=0)) == asdict(replace(full, steps=0, role_changes=0))


def test_jobs_come_back_in_the_order_given_with_what_they_cost() -> None:
    with resources(jobs=2) as used:
        assert in_processes(pow, [(2, 5), (3, 2), (2, 1)], ["a", "b", "c"], jobs=2, title="powers") == [32, 9, 2]
    assert in_processes(pow, [(2, 5), (3, 2)], ["a", "b"], jobs=1, title="powers") == [32, 9]
    assert used["jobs"] == 2 and used["wall_s"] > 0 and used["cpu_s"] >= 0
    assert len(used["load_average_start"]) == len(used["load_average_end"]) == 3
    assert "2 jobs at a time" in describe(used)
