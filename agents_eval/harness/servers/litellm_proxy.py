"""LiteLLM's proxy (`litellm --config`) as a child process: one model group over OpenAI-compatible upstreams,
load-balanced by LiteLLM's router as its users configure it (`router_settings.routing_strategy`), ready when
`GET /health/liveliness` answers 200. A fresh master key (`LITELLM_MASTER_KEY`, as the proxy requires) is the
clients' key (`ServerProcess.env` keeps it out of reports).
`LITELLM_LOCAL_MODEL_COST_MAP` keeps it from fetching its price list (the host is offline)."""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from agents_eval.harness.servers.process import ServerProcess, free_port, running_process

MODEL_GROUP = "agents"


def new_master_key() -> str:
    return f"sk-{secrets.token_hex(32)}"
DEFAULT_STRATEGY = "simple-shuffle"  # LiteLLM's default and the one its docs recommend for production


def proxy_config(upstreams: Sequence[str], model: str, strategy: str) -> dict[str, Any]:
    """A model group of one deployment per upstream (`<url>/v1`), all serving `model` (`openai/` provider)."""
    deployments = [{"model_name": MODEL_GROUP,
                    "litellm_params": {"model": f"openai/{model}", "api_base": f"{url}/v1", "api_key": "none"}}
                   for url in upstreams]
    return {"model_list": deployments, "router_settings": {"routing_strategy": strategy, "num_retries": 0},
            "litellm_settings": {"drop_params": False}}


@contextlib.contextmanager
def running_litellm_proxy(upstreams: Sequence[str], model: str, log_path: Path, master_key: str,
                          strategy: str = DEFAULT_STRATEGY) -> Iterator[ServerProcess]:
    """The proxy until the block exits; its config beside its log; clients send `master_key` as their key."""
    config_path = log_path.with_suffix(".yaml")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(proxy_config(upstreams, model, strategy)))
    port = free_port()
    command = [str(Path(sys.executable).with_name("litellm")), "--config", str(config_path),
               "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    key = {"LITELLM_MASTER_KEY": master_key}
    with running_process(command, port, env, log_path, "/health/liveliness", "the LiteLLM proxy",
                         hidden_env=key) as proxy:
        yield proxy
