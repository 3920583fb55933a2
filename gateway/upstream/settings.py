"""Upstream settings: the `upstreams:` list of `configs/gateway.yaml` (or `AGENTSERVE_UPSTREAMS`, a JSON list)
and the `upstream:` block that tunes the pool."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]
Routing = Literal["affinity", "round_robin"]


class UpstreamSpec(BaseModel):
    """One upstream replica. A plain string in the list is its `url`."""

    model_config = ConfigDict(extra="forbid")

    url: str  # base URL of its OpenAI API, e.g. http://10.0.0.5:8000/v1
    model: str | None = None  # the model name it serves; None: the first of its GET /models
    api_key: str | None = None  # sent as a bearer token
    kv_role: KVRole | None = None  # a vLLM instance started with a KV connector; None: a plain OpenAI server

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")


class UpstreamPoolSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    routing: Routing = "affinity"  # round_robin: the baseline the upstream benchmark compares against
    load_factor: float = Field(default=1.25, gt=1.0)  # bounded loads: a replica takes at most this x the mean
    virtual_nodes: int = Field(default=64, ge=1)  # points per replica on the hash ring
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=5.0, gt=0)
    failed_checks_down: int = Field(default=2, ge=1)  # consecutive failed health checks that mark a replica down
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_token_timeout_s: float = Field(default=30.0, gt=0)  # one try, until its first output
    request_budget_s: float = Field(default=60.0, gt=0)  # all tries of one request, until its first output
    stream_idle_timeout_s: float = Field(default=60.0, gt=0)  # silence that cuts a started stream
    prefill_share: float = Field(default=0.5, ge=0.0, le=1.0)  # of kv_both instances serving prefill (P/D)


def parse_upstreams(items: list[str | dict[str, object] | UpstreamSpec]) -> list[UpstreamSpec]:
    return [item if isinstance(item, UpstreamSpec) else
            UpstreamSpec(url=item) if isinstance(item, str) else UpstreamSpec.model_validate(item)
            for item in items]
