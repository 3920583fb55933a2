"""The configurations `agentserve bench --workload` can compare: what each switches on, the gateway
environment that does it, and the client it gets.

The default three are `baseline`, `disaggregated` and `agent`. `--configs ablation` runs seven, each measured
against the step named in its `previous` (the ablation table), adding what `adds` says:

    baseline -> caching -> sessions -> pruning             (the colocated engine)
                caching -> disaggregated -> routing -> agent (prefill/decode workers)

`replicas` (in neither set) is the baseline as data-parallel engines: as many colocated engine processes as the
disaggregated configurations have workers, each with their threads, no prefix cache, the stateless client,
least-loaded routing. On a host where one engine's extra threads add little (`tiny`'s small matrices on two
cores), it is the stronger baseline.

`disaggregated` is DistServe, with prefix caching and the stateless client: it differs from `caching` by the
disaggregation alone. KV-aware routing sends a session's turn to the worker holding its KV (session homes,
engine/workers/coordinator/session_homes.py): without a session there is nothing to route by, so `routing` also turns on
the session client and pruning and masks, whose share on their own the colocated steps measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

COMMON_ENV = {  # no keys; admission never refuses, so an overloaded config shows latency, not rejections
    "AGENTSERVE_AUTH_ENABLED": "false", "AGENTSERVE_LIMITS__TTFT_SLO_S": "1000000000"}


@dataclass(frozen=True)
class BenchConfig:
    name: str
    label: str
    disaggregated: bool  # prefill and decode workers; else the colocated engine
    prefix_caching: bool
    sessions: bool  # the client keeps a session (Responses WebSocket, or X-Session-Id): turn-delta reuse, KV pins
    pruning: bool  # pruning on ingest and sparse history masks
    routing: bool = False  # KV-aware routing and conditional disaggregation (disaggregated only)
    controller: bool = False  # the capacity controller moves workers between roles (disaggregated only)
    previous: str | None = None  # the ablation step this one is measured against
    adds: str = ""  # what it adds to `previous`
    replicas: bool = False  # colocated engines, one worker process each, as many as the disaggregated workers

    def env(self) -> dict[str, str]:
        """The gateway environment of this configuration's switches (COMMON_ENV and user overrides aside)."""
        env = {"AGENTSERVE_DISAGGREGATED": _flag(self.disaggregated or self.replicas),
               "AGENTSERVE_ENGINE_ENABLE_PREFIX_CACHING": _flag(self.prefix_caching),
               "AGENTSERVE_TRAJECTORY_PRUNE": _flag(self.pruning),
               "AGENTSERVE_TRAJECTORY_MASKS__ENABLED": _flag(self.pruning)}
        if self.disaggregated or self.replicas:
            env["AGENTSERVE_CAPACITY_ENABLED"] = _flag(self.controller)
        if self.controller:  # the router's split tells it when a role has no work: it may leave one no worker
            env["AGENTSERVE_CAPACITY_MIN_PER_ROLE"] = "0"
        if self.disaggregated and not self.routing:  # DistServe: every prompt prefilled remotely, load-only routing
            env |= {"AGENTSERVE_CAPACITY_LOCAL_PREFILL_MAX_TOKENS": "0",
                    "AGENTSERVE_CAPACITY_LOCAL_PREFILL_MAX_UNCACHED_SHARE": "0",
                    "AGENTSERVE_CAPACITY_OVERLAP_WEIGHT": "0"}
        return env


def _flag(value: bool) -> str:
    return "true" if value else "false"


_ALL = (
    BenchConfig("baseline", "single-node baseline", False, False, False, False),
    BenchConfig("caching", "+ prefix caching", False, True, False, False, previous="baseline",
                adds="prefix caching (blocks shared by hash: the system prompt, resent history)"),
    BenchConfig("sessions", "+ sessions (turn-delta reuse)", False, True, True, False, previous="caching",
                adds="the session client: the gateway keeps the trajectory, prefills only the turn delta and pins "
                     "the session's KV over the tool gap"),
    BenchConfig("pruning", "+ pruning and masks", False, True, True, True, previous="sessions",
                adds="observations pruned on ingest, older observations masked from attention"),
    BenchConfig("disaggregated", "disaggregated (DistServe)", True, True, False, False, previous="caching",
                adds="prefill and decode workers, every prompt prefilled on a prefill worker, a fixed split"),
    BenchConfig("routing", "+ KV-aware routing, conditional disaggregation", True, True, True, True, routing=True,
                previous="disaggregated",
                adds="sessions, pruning and masks, KV-aware routing to the session's worker, small deltas "
                     "prefilled on the decode worker"),
    BenchConfig("agent", "agent-optimized", True, True, True, True, routing=True, controller=True,
                previous="routing", adds="the capacity controller"),
    BenchConfig("replicas", "colocated replicas (data parallel)", False, False, False, False, replicas=True),
)
CONFIGS: Mapping[str, BenchConfig] = {config.name: config for config in _ALL}
DEFAULT_CONFIGS = ("baseline", "disaggregated", "agent")
ABLATION_CONFIGS = tuple(config.name for config in _ALL if not config.replicas)
NAMED_SETS: Mapping[str, tuple[str, ...]] = {"default": DEFAULT_CONFIGS, "ablation": ABLATION_CONFIGS}
LABELS = {name: config.label for name, config in CONFIGS.items()}


def config_names(text: str) -> tuple[str, ...]:
    """`--configs`: comma-separated names, a named set among them expanded in place (`ablation`, `default`)."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        names += NAMED_SETS.get(part, (part,) if part else ())
    return tuple(names)
