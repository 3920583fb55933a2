"""The replicas behind the gateway: health-checked (GET /models), their in-flight load counted, and one picked
per request by the routing policy (session affinity with bounded loads, or round-robin). vLLM instances have a
prefill or decode role: `kv_producer` and `kv_consumer` keep theirs, `kv_both` start from `prefill_share` and
the capacity controller (`gateway/upstream/capacity.py`) moves them with `set_role`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx

from gateway.upstream.hashing import BoundedLoadRing
from gateway.upstream.settings import UpstreamPoolSettings, UpstreamSpec

log = logging.getLogger(__name__)
Role = Literal["any", "prefill", "decode"]


@dataclass
class Replica:
    spec: UpstreamSpec
    healthy: bool = True  # until a health check or a request says otherwise
    in_flight: int = 0  # requests routed here, either leg
    prefill_tokens: int = 0  # prompt tokens of the prefill legs running here
    decode_streams: int = 0  # replies streaming from here
    failed_checks: int = 0  # consecutive
    models: list[str] = field(default_factory=list)  # what its GET /models listed

    @property
    def name(self) -> str:
        return self.spec.base_url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}

    @contextlib.contextmanager
    def prefilling(self, prompt_tokens: int) -> Iterator[None]:
        self.prefill_tokens += prompt_tokens
        try:
            yield
        finally:
            self.prefill_tokens -= prompt_tokens


def role_split(specs: Sequence[UpstreamSpec], prefill_share: float) -> dict[str, Role]:
    """The P/D role of each instance: kv_producer prefills, kv_consumer decodes, and the kv_both instances
    split by the prefill share (at least one each way when there are two or more)."""
    roles: dict[str, Role] = {}
    both = [s for s in specs if s.kv_role == "kv_both"]
    prefills = round(prefill_share * len(both))
    if len(both) >= 2:
        prefills = min(max(prefills, 1), len(both) - 1)
    for index, spec in enumerate(both):
        roles[spec.base_url] = "prefill" if index < prefills else "decode"
    for spec in specs:
        if spec.kv_role == "kv_producer":
            roles[spec.base_url] = "prefill"
        elif spec.kv_role == "kv_consumer":
            roles[spec.base_url] = "decode"
    return roles


class UpstreamPool:
    def __init__(self, specs: Sequence[UpstreamSpec], settings: UpstreamPoolSettings) -> None:
        if not specs:
            raise ValueError("an upstream pool needs at least one upstream")
        self.settings = settings
        self.replicas = {spec.base_url: Replica(spec) for spec in specs}
        if len(self.replicas) != len(specs):
            raise ValueError("upstreams must have distinct URLs")
        self.roles = role_split(specs, settings.prefill_share)
        self.ring = BoundedLoadRing(list(self.replicas), settings.virtual_nodes, settings.load_factor)
        self._turn = itertools.count()
        self._health: asyncio.Task[None] | None = None

    @property
    def movable(self) -> list[str]:
        """The kv_both instances, in the configured order: the capacity controller's to move."""
        return [name for name, r in self.replicas.items() if r.spec.kv_role == "kv_both"]

    def set_role(self, name: str, role: str) -> None:
        """New requests of its old role stop going to the instance; those it runs finish there."""
        if name not in self.movable or role not in ("prefill", "decode"):
            raise ValueError(f"{name} is not a kv_both instance, or {role!r} is not prefill or decode")
        # one swap of the whole mapping: the controller runs on the engine thread, `pick` on the event loop
        self.roles = {**self.roles, name: "prefill" if role == "prefill" else "decode"}

    @property
    def disaggregated(self) -> bool:
        """vLLM prefill/decode instances: requests go through a prefill leg, then a decode leg."""
        roles = set(self.roles.values())
        return "prefill" in roles and "decode" in roles

    def pick(self, key: str, role: Role = "any", exclude: frozenset[str] = frozenset()) -> Replica | None:
        """A healthy replica of the role that was not tried yet; None when there is none."""
        roles = self.roles  # one view, whatever the controller swaps in meanwhile
        allowed = {name for name, r in self.replicas.items()
                   if r.healthy and name not in exclude and (role == "any" or roles.get(name) == role)}
        if not allowed:
            return None
        if self.settings.routing == "round_robin":
            order = sorted(allowed)
            return self.replicas[order[next(self._turn) % len(order)]]
        loads = {name: r.in_flight for name, r in self.replicas.items()}
        name = self.ring.pick(key, loads, allowed)
        return None if name is None else self.replicas[name]

    def served_model(self) -> str | None:
        for replica in self.replicas.values():
            if replica.spec.model or replica.models:
                return replica.spec.model or replica.models[0]
        return None

    async def check(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self._check_one(client, r) for r in self.replicas.values()))

    async def _check_one(self, client: httpx.AsyncClient, replica: Replica) -> None:
        try:
            response = await client.get(f"{replica.name}/models", headers=replica.headers(),
                                        timeout=self.settings.health_timeout_s)
            healthy = response.status_code == 200
            if healthy:
                replica.models = [str(m.get("id")) for m in response.json().get("data", []) if m.get("id")]
        except (httpx.HTTPError, ValueError):
            healthy = False
        replica.failed_checks = 0 if healthy else replica.failed_checks + 1
        if not healthy and replica.failed_checks < self.settings.failed_checks_down:
            return  # a busy single-threaded server may miss one check
        if healthy != replica.healthy:
            log.warning("upstream %s is %s", replica.name, "back up" if healthy else "down")
        replica.healthy = healthy

    def start(self, client: httpx.AsyncClient) -> None:
        async def loop() -> None:
            while True:
                await self.check(client)
                await asyncio.sleep(self.settings.health_interval_s)

        self._health = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
