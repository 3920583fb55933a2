"""Workers as Ray actors on a real multi-node Ray cluster on loopback (Ray's own `cluster_utils.Cluster`: a
raylet per node): each role on the nodes labelled for it, identical greedy and sampled tokens to the
colocated engine with the KV crossing nodes over TCP, a role moved across nodes, a node that joins put to
work, and a node lost under load with no request lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.workers import messages as m
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings, RaySettings
from tests.engine.workers.test_disaggregated import ALWAYS_REMOTE, GREEDY, PROMPTS, SAMPLED, SETTINGS

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'agentserve[ray]')")
cluster_utils = pytest.importorskip("ray.cluster_utils", reason="this ray has no cluster_utils")

pytestmark = pytest.mark.slow
PREFILL_NODE, DECODE_NODE = {"agentserve_prefill": 1}, {"agentserve_decode": 1}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=2, resources=PREFILL_NODE)
    cluster.add_node(num_cpus=2, resources=DECODE_NODE)
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def engine(cluster: Any) -> Iterator[WorkerEngine]:
    # a Ray worker starts a Python process, imports torch and loads the model on a node of the test's own cluster:
    # beside other work on 2 cores that took over the default 180 s, so the test waits as long as pytest lets it
    deployment = DeploymentSettings(prefill=1, decode=1, transport="tcp", kv_timeout_s=5.0, placement="ray",
                                    ray=RaySettings(address=cluster.address, watch_nodes_s=0.2), ready_timeout_s=540.0)
    engine = WorkerEngine("tiny", SETTINGS, deployment, ALWAYS_REMOTE)
    yield engine
    engine.shutdown()


def colocated(params: SamplingParams, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
    return [r.token_ids for r in LLMEngine("tiny", SETTINGS).generate(prompts, params)]


def nodes_with(resource: dict[str, int]) -> set[str]:
    [name] = resource
    return {node["NodeID"] for node in ray.nodes() if node["Alive"] and name in node["Resources"]}


def step_until(engine: WorkerEngine, done: Any, timeout_s: float = 300.0) -> None:  # slow on a busy host
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        engine.step(0.05)


def test_each_role_runs_on_its_nodes(engine: WorkerEngine) -> None:
    [prefill, decode] = engine.workers
    assert prefill.node in nodes_with(PREFILL_NODE) and decode.node in nodes_with(DECODE_NODE)
    assert prefill.node != decode.node and prefill.conn is not None


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_same_tokens_as_colocated_with_kv_across_nodes(engine: WorkerEngine, params: SamplingParams) -> None:
    before = engine.transfers.requests
    assert [r.token_ids for r in engine.generate(PROMPTS, params)] == colocated(params)
    assert engine.transfers.requests - before == len(PROMPTS) and engine.transfers.bytes > 0
    assert sum(c.recomputed + c.timed_out for c in engine.kv_counters().values()) == 0


def test_the_controller_moves_a_role_across_nodes(engine: WorkerEngine) -> None:
    capacity = engine.capacity
    assert capacity is not None
    moves, switched = capacity.moves, len(engine.role_switches)
    capacity.pin(0, 2, time.monotonic())  # what POST /admin/capacity does: the prefill node's worker decodes
    step_until(engine, lambda: len(engine.role_switches) == switched + 1)
    assert capacity.moves == moves + 1 and [w.role for w in engine.workers] == [m.DECODE, m.DECODE]
    assert [r.token_ids for r in engine.generate(PROMPTS[:3], GREEDY)] == colocated(GREEDY, PROMPTS[:3])
    capacity.pin(1, 1, time.monotonic())
    step_until(engine, lambda: len(engine.role_switches) == switched + 2)
    capacity.unpin(time.monotonic())
    assert sorted(w.role for w in engine.workers) == [m.DECODE, m.PREFILL]


def test_a_joined_node_serves_and_a_lost_node_loses_no_request(cluster: Any, engine: WorkerEngine) -> None:
    first_decoder = next(w for w in engine.workers if w.role == m.DECODE)
    prefiller = next(w for w in engine.workers if w.role == m.PREFILL)
    lost = next(node for node in cluster.worker_nodes if node.node_id == first_decoder.node)
    joined = cluster.add_node(num_cpus=2, resources=DECODE_NODE)
    step_until(engine, lambda: any(w.node == joined.node_id and w.alive for w in engine.workers))
    newcomer = next(w for w in engine.workers if w.node == joined.node_id)
    assert newcomer.role == m.DECODE and set(newcomer.kv_addresses) == {0, 1}
    ids = [engine.add_request(p, SAMPLED) for p in PROMPTS]
    assert newcomer.worker_id in prefiller.pending_decode.values()  # the newcomer takes its share
    outputs: dict[str, list[int]] = {request_id: [] for request_id in ids}
    _collect(engine, outputs, until=lambda: any(outputs.values()))
    cluster.remove_node(lost)
    _collect(engine, outputs, until=lambda: not engine.tracked)
    assert [outputs[i] for i in ids] == colocated(SAMPLED)
    assert first_decoder.worker_id in engine.dead_workers


def _collect(engine: WorkerEngine, outputs: dict[str, list[int]], until: Any, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "timed out"
        for out in engine.step(0.05):
            outputs[out.request_id] += out.new_token_ids
