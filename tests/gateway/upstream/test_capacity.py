"""The capacity controller over vLLM `kv_both` instances: the real `CapacityPolicy` moves an instance between
prefill and decode as the gateway's admitted work shifts (fake load, controller clock injected), and, against
fake vLLM instances on loopback, a turn's prefill leg goes to the instance moved to prefill; `/admin/capacity`
reports and pins the split."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import AdmittedWork
from engine.core.stats import AgentSignals
from gateway.auth import ANONYMOUS
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings
from gateway.upstream.capacity import UpstreamCapacity
from gateway.upstream.hashing import BoundedLoadRing
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.settings import UpstreamPoolSettings, UpstreamSpec
from tests.conftest import free_port
from tests.gateway.conftest import ADMIN, ADMIN_HEADERS, running_gateway, serving
from tests.gateway.upstream.test_protocol import Fake

BOTH = [f"http://both{i}/v1" for i in range(3)]
PRODUCER, CONSUMER = "http://producer/v1", "http://consumer/v1"
PREFILL_BACKLOG = AdmittedWork(prefill_tokens=20_000, decode_tokens=10, streams=1, prompts=4)
DECODE_BACKLOG = AdmittedWork(prefill_tokens=0, decode_tokens=100_000, streams=40, prompts=0)
# the rates the backlogs above are sized for: 4 prefill workers' worth, then 4 decode workers' worth
POLICY = {"hold_s": 2.0, "min_per_role": 1, "demand_margin": 0.25, "prefill_tokens_per_s": 10_000.0,
          "prefill_drain_s": 0.5, "target_tpot_s": 0.05, "decode_s_per_token": 0.005, "forecast_horizon_s": 1.0,
          "pinned_split": None}


def controller(**capacity: Any) -> UpstreamCapacity:
    """Three kv_both instances starting 1 prefill / 2 decode, and a fixed producer and consumer."""
    specs = [UpstreamSpec(url=url, kv_role="kv_both") for url in BOTH]
    specs += [UpstreamSpec(url=PRODUCER, kv_role="kv_producer"), UpstreamSpec(url=CONSUMER, kv_role="kv_consumer")]
    pool = UpstreamPool(specs, UpstreamPoolSettings(prefill_share=0.34))
    return UpstreamCapacity(CapacitySettings(**{**POLICY, **capacity}), pool)


def roles(loop: UpstreamCapacity) -> list[str]:
    return [loop.pool.roles[url] for url in BOTH]


def test_prefill_backlog_moves_a_decode_instance_to_prefill_and_decode_backlog_moves_it_back() -> None:
    loop = controller()
    assert roles(loop) == ["prefill", "decode", "decode"]  # prefill_share: the starting split
    loop.pool.replicas[BOTH[2]].in_flight = 3  # busier than both1: both1 is the one to move
    loop.update_signals(AgentSignals(admitted=PREFILL_BACKLOG), now=100.0)
    assert roles(loop) == ["prefill", "prefill", "decode"]
    assert loop.last_decision is not None and "admitted" in loop.last_decision.reason
    assert loop.switched_at == {1: 100.0} and loop.moves == 1

    loop.pool.replicas[BOTH[2]].in_flight = 0
    loop.pool.replicas[BOTH[0]].in_flight = 2  # busier than both1: both1 goes back
    loop.update_signals(AgentSignals(admitted=DECODE_BACKLOG), now=103.0)  # past hold_s
    assert roles(loop) == ["prefill", "decode", "decode"]
    assert loop.moves == 2 and loop.target() == {"prefill": 1, "decode": 2}
    assert (loop.pool.roles[PRODUCER], loop.pool.roles[CONSUMER]) == ("prefill", "decode")  # fixed
    assert [(e.kind, e.detail) for e in loop.events.events if e.kind == "move"] == [
        ("move", {"worker_id": 1, "role": "prefill"}), ("move", {"worker_id": 1, "role": "decode"})]


def test_the_policy_sees_only_healthy_kv_both_instances_with_the_gateways_counts() -> None:
    loop = controller()
    first = loop.pool.replicas[BOTH[0]]
    first.in_flight, first.prefill_tokens, first.decode_streams = 2, 300, 1
    loop.pool.replicas[BOTH[2]].healthy = False
    snapshot = loop.snapshot(5.0)
    assert [(w.worker_id, w.role) for w in snapshot.workers] == [(0, "prefill"), (1, "decode")]
    assert (snapshot.workers[0].running, snapshot.workers[0].waiting_prefill_tokens,
            snapshot.workers[0].decode_streams) == (2, 300, 1)
    assert loop.split() == {"prefill": 1, "decode": 1}
    with pytest.raises(ValueError, match="not a kv_both instance"):
        loop.pool.set_role(CONSUMER, "prefill")


def test_a_pinned_split_holds_until_unpinned() -> None:
    loop = controller()
    loop.pin(0, 3, now=1.0)
    assert roles(loop) == ["decode", "decode", "decode"]  # a pin has no floor: min_per_role does not apply
    loop.update_signals(AgentSignals(admitted=PREFILL_BACKLOG), now=10.0)
    assert roles(loop) == ["decode", "decode", "decode"]  # the load asks for prefill: the pin holds
    loop.unpin(now=11.0)
    assert roles(loop).count("prefill") == 2


def homed(ring: BoundedLoadRing, homes: dict[str, list[str]], skip: int = 0) -> str:
    """A session id (the anonymous principal's) whose first replica on the ring among each list of `homes`'s
    values is its key."""
    def fits(session: str) -> bool:
        order = ring.walk(session_key(ANONYMOUS, session).path)
        return all(next(n for n in order if n in among) == home for home, among in homes.items())

    found = (f"s{i}" for i in range(10_000) if fits(f"s{i}"))
    for _ in range(skip):
        next(found)
    return next(found)


@pytest.fixture
def instances() -> Iterator[list[tuple[Fake, str]]]:
    """Three fake vLLM kv_both instances; their prefill legs wait for the test's gate."""
    gate = threading.Event()
    fakes = [Fake(f"both{i}", gate=gate) for i in range(3)]
    with serving(fakes[0].app(), free_port()) as a, serving(fakes[1].app(), free_port()) as b, \
            serving(fakes[2].app(), free_port()) as c:
        try:
            yield [(fakes[0], a + "/v1"), (fakes[1], b + "/v1"), (fakes[2], c + "/v1")]
        finally:
            gate.set()  # a failed test leaves no prefill leg waiting: the servers can stop


def admin_capacity(url: str, pin: dict[str, Any] | None = None) -> dict[str, Any]:
    if pin is None:
        reply = httpx.get(url + "/admin/capacity", headers=ADMIN_HEADERS, timeout=30)
    else:
        reply = httpx.post(url + "/admin/capacity", headers=ADMIN_HEADERS, json=pin, timeout=30)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def wait_for_split(url: str, prefill: int) -> dict[str, Any]:
    for _ in range(300):  # bounded: the controller decides on the admission that tips the load
        report = admin_capacity(url)
        if report["split"]["prefill"] == prefill:
            return report
        time.sleep(0.1)
    raise AssertionError(f"the split stayed {report['split']}: {report['last_decision']}")


def chat(url: str, session: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": session}, timeout=60,
                      json={"model": "tiny", "messages": [{"role": "user", "content": "Read the log and fix it."}]})


def test_after_the_move_prefill_legs_go_to_the_moved_instance(instances: list[tuple[Fake, str]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSERVE_CAPACITY_PREFILL_TOKENS_PER_S", "10")  # each waiting prompt: a busy worker
    names = [url for _, url in instances]
    upstreams = [UpstreamSpec(url=url, kv_role="kv_both") for url in names]
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=16, api_keys=[ADMIN],
                               upstreams=upstreams, upstream=UpstreamPoolSettings(prefill_share=0.34))
    ring = BoundedLoadRing(names, settings.upstream.virtual_nodes, settings.upstream.load_factor)
    # the held turns prefill on both0 (whether both1 moved yet or not) and decode on both2: both1 moves
    waiting = [homed(ring, {names[0]: names[:2], names[2]: names[1:]}, skip) for skip in range(2)]
    moved_home = homed(ring, {names[1]: names[:2]})  # a prefill leg homed on both1 once it prefills
    gate = instances[0][0].gate
    assert gate is not None
    with running_gateway(settings) as url, ThreadPoolExecutor(2) as pool:
        assert admin_capacity(url)["split"] == {"prefill": 1, "decode": 2}
        held = [pool.submit(chat, url, session) for session in waiting]  # prefilling on both0 until the gate
        report = wait_for_split(url, prefill=2)
        gate.set()
        assert all(reply.result().status_code == 200 for reply in held)
        assert [w["role"] for w in report["workers"]] == ["prefill", "prefill", "decode"]
        assert chat(url, moved_home).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        pinned = admin_capacity(url, {"prefill": 1, "decode": 2})
        unpinned = admin_capacity(url, {"unpin": True})
    both0, both1, both2 = (fake for fake, _ in instances)
    assert [s["body"]["stream"] for s in both0.seen] == [False, False]  # the held turns' prefill legs
    assert [s["body"]["stream"] for s in both2.seen] == [True, True, True]  # every decode leg
    assert [s["body"]["stream"] for s in both1.seen] == [False]  # the moved instance prefilled the new turn
    assert both1.seen[0]["session_id"] == session_key(ANONYMOUS, moved_home).path
    assert re.search(r'^agentserve:num_workers\{role="prefill"\} 2\.0$', metrics, re.MULTILINE)
    assert re.search(r"^agentserve:capacity_role_moves_total 1\.0$", metrics, re.MULTILINE)
    assert pinned["pinned"] == {"prefill": 1, "decode": 2} and pinned["split"] == {"prefill": 1, "decode": 2}
    assert unpinned["pinned"] is None
