"""The experiments' search logic: the placement space and the rate search, without simulating."""

from __future__ import annotations

from agents_eval.sim.experiments import placements, rate_at_slo
from agents_eval.sim.model.config import cluster_config
from agents_eval.sim.run import Summary


def _summary(rate: float, attainment: float) -> Summary:
    return Summary(10, 1.0, 10 * rate, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, attainment, 100, 0.0, 0, 10)


def test_placements_split_whole_nodes_between_the_base_devices() -> None:
    configs = placements(cluster_config("moe27b-distserve"), 32, (4, 8))
    assert len(configs) == 2 * 2 * 3  # prefill tp x decode tp x (1, 2 or 3 prefill nodes of 4)
    for config in configs:
        prefill, decode = config.pools
        assert (prefill.role, prefill.device, decode.role, decode.device) == ("prefill", "a800", "decode", "h100")
        assert prefill.nodes + decode.nodes == 4 and prefill.gpus + decode.gpus == 32
    assert len({c.name for c in configs}) == len(configs)


def test_rate_search_halves_below_a_failing_start_then_bisects() -> None:
    probed: list[float] = []

    def run(rate: float) -> Summary:
        probed.append(rate)
        return _summary(rate, 1.0 if rate <= 0.3 else 0.5)

    best, points = rate_at_slo(run, 1.0, steps=2)
    assert probed == [1.0, 0.5, 0.25, 0.375, 0.3125]
    assert best is not None and best.session_rate == 0.25 and len(points) == 5


def test_rate_search_doubles_while_passing() -> None:
    best, _ = rate_at_slo(lambda rate: _summary(rate, 1.0 if rate <= 5 else 0.0), 1.0, steps=1)
    assert best is not None and best.session_rate == 4.0  # 1, 2, 4 pass, 8 fails, 6 fails
