"""`agentserve serve` (the gateway with its embedded engine) and `agentserve keys new`."""

from __future__ import annotations

import argparse
import json
import os

from gateway.auth import new_key
from gateway.settings import GatewaySettings


def register(sub: argparse._SubParsersAction) -> None:
    _add_serve(sub)
    _add_keys(sub)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the gateway with its embedded engine")
    p.add_argument("--config", help="gateway YAML (default configs/gateway.yaml)")
    p.add_argument("--model", help="built-in model name or Hugging Face checkpoint dir")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--kv-cache-memory", type=kv_cache_memory_env, metavar="SIZE|FRACTION",
                   help="the paged KV cache: a size (6GiB, 512MiB, bytes) or a share of the memory the engine may "
                        "use (0.4 or 40%%; of the available RAM on the CPU, of the free device memory on a GPU); "
                        "default: configs/engine.yaml (25%% of the available RAM)")
    p.set_defaults(run=_run_serve)


MEMORY_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
KV_SIZE_VARIABLES = ("AGENTSERVE_ENGINE_NUM_KV_BLOCKS", "AGENTSERVE_ENGINE_KV_CACHE_BYTES")


def kv_cache_memory_env(text: str) -> dict[str, str]:
    """`--kv-cache-memory`'s engine settings, as the environment variables the engine's processes read."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if value.endswith("%") or "." in value:
            fraction = float(value.removesuffix("%")) / (100 if value.endswith("%") else 1)
            if not 0 < fraction <= 1:
                raise ValueError
            return {"AGENTSERVE_ENGINE_KV_CACHE_MEMORY_FRACTION": str(fraction),
                    "AGENTSERVE_ENGINE_KV_CACHE_DEVICE_MEMORY_FRACTION": str(fraction)}
        unit = MEMORY_UNITS.get(value[-1:], 1)
        size = int(float(value.rstrip("kmgt")) * unit)
        if size < 1:
            raise ValueError
        return {"AGENTSERVE_ENGINE_KV_CACHE_BYTES": str(size)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a size (6GiB, 512MiB, 1000000) or a fraction in (0, 1] (0.4, 40%), got {text!r}") from None


def _run_serve(args: argparse.Namespace) -> None:
    if args.config:
        os.environ["AGENTSERVE_GATEWAY_CONFIG"] = args.config
    if args.kv_cache_memory:  # over any size the environment sets
        for variable in KV_SIZE_VARIABLES:
            os.environ.pop(variable, None)
        os.environ.update(args.kv_cache_memory)
    overrides = {k: v for k, v in (("model", args.model), ("host", args.host), ("port", args.port)) if v}
    from gateway.server.serve import serve

    serve(GatewaySettings(**overrides))


def _add_keys(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="API keys")
    actions = p.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="print a new API key and the sha256 to put in configs/gateway.yaml")
    new.set_defaults(run=_run_new_key)


def _run_new_key(_: argparse.Namespace) -> None:
    key = new_key()
    print(json.dumps({"key": key.key, "sha256": key.sha256}))
