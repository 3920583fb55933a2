"""Deployment settings: every shipped deployment loads, and a Ray placement refuses a KV transport that
cannot cross nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.workers.deployment import DeploymentSettings

DEPLOYMENTS = sorted((Path(__file__).parents[3] / "configs" / "deployments").glob("*.yaml"))


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=[p.stem for p in DEPLOYMENTS])
def test_each_shipped_deployment_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSERVE_DEPLOYMENT_CONFIG", str(path))
    deployment = DeploymentSettings()
    assert deployment.prefill + deployment.decode > 0


def test_the_seed_deployment_is_the_seeds_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSERVE_DEPLOYMENT_CONFIG", str(DEPLOYMENTS[0].with_name("seed.yaml")))
    seed = DeploymentSettings()
    assert (seed.prefill, seed.decode, seed.placement, seed.transport) == (32, 128, "ray", "rdma")
    assert seed.ray.accelerator_types == {"prefill": "A800", "decode": "H100"}


@pytest.mark.parametrize("transport", ["shm", "inproc"])
def test_ray_placement_needs_a_transport_between_nodes(transport: str) -> None:
    with pytest.raises(ValidationError, match="cannot reach across them"):
        DeploymentSettings(placement="ray", transport=transport)


def test_the_colocated_deployment_is_one_worker_here() -> None:
    colocated = DeploymentSettings.colocated(threads=2)
    assert (colocated.prefill, colocated.decode, colocated.threads_per_worker, colocated.placement) == \
        (0, 1, 2, "local")


@pytest.mark.parametrize("nice", [-1, 20])
def test_worker_nice_is_refused_outside_what_an_unprivileged_process_may_add(nice: int) -> None:
    with pytest.raises(ValidationError, match="worker_nice"):
        DeploymentSettings(worker_nice=nice)


@pytest.mark.parametrize("threads_per_worker", [1, None])
def test_a_worker_runs_the_deployments_threads_not_the_engines(threads_per_worker: int | None) -> None:
    """AGENTSERVE_ENGINE_NUM_THREADS is the colocated engine's; each worker process takes threads_per_worker."""
    from engine.config import EngineSettings
    from engine.workers.worker.process import WorkerSpec

    engine = EngineSettings(num_threads=2)
    spec = WorkerSpec(0, "tiny", engine, "shm", "decode", threads_per_worker, kv_timeout_s=5.0)
    assert spec.engine_settings().num_threads == threads_per_worker
    assert spec.engine_settings().model_dump(exclude={"num_threads"}) == engine.model_dump(exclude={"num_threads"})
