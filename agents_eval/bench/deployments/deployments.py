"""The deployments `agentserve bench --workload W --loop closed` compares, each on the same cores (`threads`):

- `baseline`, `disaggregated`, `agent`: agentserve's own engine, the configurations of the agent benchmark
  (agents_eval/bench/agent/configs.py), each its gateway process with that configuration's environment;
- `colocated`: `agentserve serve` as it starts, one engine on all `threads` (prefix caching, sessions, pruning
  and masks: the agent benchmark's `pruning` configuration);
- `llama-server`: llama.cpp's server alone, `threads` threads, a slot per agent (`max_agents`), one KV pool of
  `kv_tokens`, its prompt cache; the client resends the whole history (it keeps no session);
- `agentserve-upstreams`: agentserve's gateway (sessions, session-affine routing) in front of two llama-servers
  of `threads / 2` threads each, each with half the slots and half the KV pool; the client keeps its session;
- `litellm-upstreams`: LiteLLM's proxy (its router, `litellm_strategy`) over the same two llama-servers; the
  client resends the whole history, as through `llama-server` alone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents_eval.bench.agent.configs import COMMON_ENV, CONFIGS
from agents_eval.bench.agent.gateway import threads_per_worker
from agents_eval.bench.agent.run import WS, gateway_env
from agents_eval.bench.peer.servers import gguf_file
from agents_eval.bench.peer.settings import require_llama_server
from agents_eval.harness.servers.gateway import running_gateway
from agents_eval.harness.servers.litellm_proxy import (
    DEFAULT_STRATEGY,
    MODEL_GROUP,
    new_master_key,
    running_litellm_proxy,
)
from agents_eval.harness.servers.llama_server import LlamaServerOptions, running_llama_server
from agents_eval.harness.servers.process import ServerProcess

# deployment -> the agent benchmark's configuration it runs
ENGINE_CONFIGS = {"baseline": "baseline", "colocated": "pruning", "disaggregated": "disaggregated", "agent": "agent"}
AGENTSERVE_CONFIGS = tuple(ENGINE_CONFIGS)
LLAMA_SERVER = "llama-server"
AGENTSERVE_UPSTREAMS = "agentserve-upstreams"
LITELLM_UPSTREAMS = "litellm-upstreams"
DEPLOYMENTS = (*AGENTSERVE_CONFIGS, LLAMA_SERVER, AGENTSERVE_UPSTREAMS, LITELLM_UPSTREAMS)
AGENTSERVE = (*AGENTSERVE_CONFIGS, AGENTSERVE_UPSTREAMS)  # the goal: agentserve's best against the best other
UPSTREAMS = 2
# The gateway waits on a busy upstream as long as the client waits on the gateway (LiteLLM's timeout, 600 s, is
# longer): on a loaded host a first token can take tens of seconds, and a try cut short is a retry elsewhere.
PATIENT = ("FIRST_TOKEN_TIMEOUT_S", "REQUEST_BUDGET_S", "STREAM_IDLE_TIMEOUT_S")


@dataclass(frozen=True)
class DeploymentOptions:
    model: str = "smollm2"
    threads: int = 2  # the cores every deployment gets
    max_agents: int = 16  # llama-server's slots
    kv_tokens: int = 65536  # llama-server's KV pool (the pair: half each)
    client: str = WS  # the session client of agentserve's session-keeping deployments
    litellm_strategy: str = DEFAULT_STRATEGY
    env: Mapping[str, str] = field(default_factory=dict)  # the user's --env, for agentserve's gateways
    request_timeout_s: float = 60.0  # the client's


@dataclass(frozen=True)
class Endpoint:
    """A running deployment: where the client sends, how it keeps sessions, what it is."""

    url: str
    sessions: bool  # the client keeps a session (its id: the server keeps the history)
    client: str  # ws or http, where it keeps sessions
    model: str | None  # the model name requests carry (None: the server's first /v1/models id)
    deployment: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # every request's (a proxy's key)


def running_deployment(name: str, options: DeploymentOptions,
                       log_dir: Path) -> contextlib.AbstractContextManager[Endpoint]:
    if name in AGENTSERVE_CONFIGS:
        return _agentserve(name, options, log_dir)
    if name == LLAMA_SERVER:
        return _llama_server(options, log_dir)
    if name in (AGENTSERVE_UPSTREAMS, LITELLM_UPSTREAMS):
        return _fronted(name, options, log_dir)
    raise ValueError(f"unknown deployment {name!r}; choose from {', '.join(DEPLOYMENTS)}")


@contextlib.contextmanager
def _agentserve(name: str, options: DeploymentOptions, log_dir: Path) -> Iterator[Endpoint]:
    config = CONFIGS[ENGINE_CONFIGS[name]]
    env = gateway_env(config.name, options.env)
    with running_gateway(options.model, env, log_dir / f"{name}.log") as gateway:
        deployment = config.deployment(options.threads // threads_per_worker(options.env),
                                       threads_per_worker(options.env))
        yield Endpoint(gateway.url, config.sessions, options.client, None,
                       {"server": "agentserve", "config": config.name, **deployment}, gateway.env)


def llama_options(options: DeploymentOptions, share: int) -> LlamaServerOptions:
    """One llama-server of `share` servers: its part of the threads, slots and KV pool."""
    return LlamaServerOptions(require_llama_server(), gguf_file(options.model), max(1, options.threads // share),
                              max(1, -(-options.max_agents // share)), options.kv_tokens // share)


@contextlib.contextmanager
def _llama_server(options: DeploymentOptions, log_dir: Path) -> Iterator[Endpoint]:
    server_options = llama_options(options, 1)
    with running_llama_server(server_options, log_dir / f"{LLAMA_SERVER}.log") as server:
        yield Endpoint(server.url, False, "http", None, {"server": LLAMA_SERVER, **server_options.deployment()})


@contextlib.contextmanager
def _fronted(name: str, options: DeploymentOptions, log_dir: Path) -> Iterator[Endpoint]:
    """Two llama-servers, and agentserve's gateway or LiteLLM's proxy in front of them."""
    server_options = llama_options(options, UPSTREAMS)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(running_llama_server(server_options, log_dir / f"{name}-upstream{i}.log"))
                   for i in range(UPSTREAMS)]
        upstreams = {"upstreams": [server_options.deployment() for _ in servers]}
        if name == AGENTSERVE_UPSTREAMS:
            front = stack.enter_context(_upstream_gateway(options, servers, log_dir / f"{name}.log"))
            yield Endpoint(front.url, True, options.client, None,
                           {"server": "agentserve gateway", "routing": "affinity", **upstreams}, front.env)
        else:
            urls, key = [server.url for server in servers], new_master_key()
            proxy = stack.enter_context(running_litellm_proxy(urls, options.model, log_dir / f"{name}.log", key,
                                                              options.litellm_strategy))
            yield Endpoint(proxy.url, False, "http", MODEL_GROUP,
                           {"server": "litellm proxy", "routing": options.litellm_strategy, **upstreams},
                           headers={"Authorization": f"Bearer {key}"})


def _upstream_gateway(options: DeploymentOptions, servers: list[ServerProcess],
                      log_path: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    """The gateway over the servers: session-affine routing (docs/upstream.md), no engine of its own."""
    env = {**COMMON_ENV, "AGENTSERVE_UPSTREAMS": json.dumps([f"{server.url}/v1" for server in servers]),
           "AGENTSERVE_UPSTREAM__ROUTING": "affinity", "AGENTSERVE_DISAGGREGATED": "false",
           **{f"AGENTSERVE_UPSTREAM__{key}": str(options.request_timeout_s) for key in PATIENT},
           "AGENTSERVE_UPSTREAM__HEALTH_TIMEOUT_S": "10", **options.env}
    return running_gateway(options.model, env, log_path)
