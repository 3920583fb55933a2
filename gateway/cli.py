"""The `agentserve` command. Bad input ends in one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.capacity import tune
from engine.config import EngineSettings
from engine.llm_engine import Completion, LLMEngine
from engine.qos import add_qos_arguments, main_qos
from engine.sampling import SamplingParams
from gateway import monitor
from gateway.auth import new_key
from gateway.settings import GatewaySettings
from predictor.cli import register as register_predictor

if TYPE_CHECKING:
    from engine.worker.coordinator import DisaggregatedEngine

EXIT_BAD_INPUT = 2


class CLIError(ValueError):
    """Bad command-line input."""


def _prompt_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CLIError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="run one request through the engine and print the result")
    p.add_argument("--model", default="smollm2", help="built-in model name, GGUF file or Hugging Face checkpoint dir")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", type=_prompt_ids, help="prompt token ids, e.g. 1,2,3")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--repeat", type=int, default=1, help="run the same request K times in one engine")
    p.add_argument("--json", action="store_true", help="print one JSON object per run")
    p.add_argument("--disaggregated", action="store_true",
                   help="prefill and decode in separate worker processes (configs/deployment.yaml)")
    p.add_argument("--transport", choices=["shm", "tcp", "rdma"], help="KV transport between the workers")
    p.set_defaults(run=_run_generate)


def _run_generate(args: argparse.Namespace) -> None:
    if args.repeat < 1:
        raise CLIError(f"--repeat must be at least 1, got {args.repeat}")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, stop=args.stop)
    params.validate()
    engine = _engine(args)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    try:
        for _ in range(args.repeat):
            [result] = engine.generate([prompt], params)
            print(json.dumps(_as_json(result)) if args.json else result.text, flush=True)
    finally:
        engine.shutdown()


def _engine(args: argparse.Namespace) -> LLMEngine | DisaggregatedEngine:
    if not args.disaggregated:
        return LLMEngine(args.model, EngineSettings())
    from engine.worker.coordinator import DisaggregatedEngine  # worker processes, transports: only when asked
    from engine.worker.deployment import DeploymentSettings

    deployment = DeploymentSettings(**({"transport": args.transport} if args.transport else {}))
    return DisaggregatedEngine(args.model, EngineSettings(), deployment)


def _as_json(result: Completion) -> dict[str, object]:
    return {
        "token_ids": result.token_ids,
        "text": result.text,
        "num_prompt_tokens": result.num_prompt_tokens,
        "num_cached_tokens": result.num_cached_tokens,
        "finish_reason": result.finish_reason,
    }


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
    from gateway.serve import serve

    serve(GatewaySettings(**overrides))


BENCHMARKS = {
    "engine": ("agents_eval.bench.engine.bench", "our engine against transformers' generate"),
    "trajectory": ("agents_eval.bench.trajectory.bench", "turn-delta reuse, trace replay, pruning, KV, phase shifts"),
    "disagg": ("agents_eval.bench.disagg.bench", "prefill/decode interference, KV hiding, role switches"),
    "kv-transfer": ("agents_eval.bench.kv_transfer", "KV transfer speed per transport against baselines"),
    "gateway": ("agents_eval.bench.gateway.bench", "gateway overhead over its engine; Responses WebSocket vs chat"),
    "capacity": ("agents_eval.bench.capacity.bench", "capacity controller: reallocation latency, p99 vs fixed splits"),
    "quality": ("agents_eval.bench.quality", "answer retention of pruning and history masks on a real model"),
    "peer": ("agents_eval.bench.peer", "llama.cpp against agentserve on the same GGUF file, same threads"),
    "batcher": ("agents_eval.bench.batcher", "SLO-deadline batching with session fairness against FCFS"),
    "faults": ("agents_eval.bench.faults", "faults under load: workers, Redis, a replica killed; nothing lost"),
    "soak": ("agents_eval.bench.soak", "long agent load: memory, descriptors and latency stay flat"),
    "overload": ("agents_eval.bench.overload", "2x the SLO rate: admitted requests within the SLO, the rest refused"),
    "upstream": ("agents_eval.bench.upstream", "session-affine routing against round-robin over upstream replicas"),
    "kv-cache": ("agents_eval.bench.kv_cache", "improved LFU against LRU and the unbounded bound on a trace"),
    "ipc": ("agents_eval.bench.ipc", "engine messages between processes: pickle against msgspec"),
    "sparse": ("agents_eval.bench.sparse", "block-sparse history attention against dense: decode and prefill"),
    "structured": ("agents_eval.bench.structured", "structured outputs: forced tool calls, json_schema, jump-forward"),
}


def _add_keys(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="API keys")
    actions = p.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="print a new API key and the sha256 to put in configs/gateway.yaml")
    new.set_defaults(run=_run_new_key)


def _run_new_key(_: argparse.Namespace) -> None:
    key = new_key()
    print(json.dumps({"key": key.key, "sha256": key.sha256}))


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (agents_eval); each writes report.json, report.md, a plot")
    agent_bench = importlib.import_module("agents_eval.bench.agent.bench")  # `bench --workload W`: no kind
    agent_bench.add_arguments(p)
    p.set_defaults(run=agent_bench.run)
    kinds = p.add_subparsers(dest="kind")
    for name, (module_name, help_text) in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        bench = kinds.add_parser(name, help=help_text)
        module.add_arguments(bench)
        bench.set_defaults(run=module.run)


def _add_qos(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("qos", help="traffic classes from configs/qos.yaml: DSCP marks, InfiniBand opensm QoS")
    add_qos_arguments(p)
    p.set_defaults(run=lambda args: sys.exit(main_qos(args)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_serve(sub)
    _add_bench(sub)
    _add_qos(sub)
    _add_keys(sub)
    register_predictor(sub)
    importlib.import_module("agents_eval.sim.cli").register(sub)  # `simulate` and `profile`
    tune.add_arguments(sub.add_parser("tune", help="decode concurrency and prefill batch size for a model on a GPU"))
    monitor.add_arguments(sub.add_parser("monitor", help="live view of a metric, the role split and alerts"))
    return parser


def exit_on_sigterm() -> None:
    """SIGTERM exits through SystemExit, so `finally` blocks run: a benchmark stopped this way stops the
    servers it started instead of leaving them behind (`serve` installs uvicorn's own handler over this)."""
    def _exit(signum: int, frame: object) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], None] = args.run
    exit_on_sigterm()
    try:
        run(args)
    except ValueError as error:  # RequestError, ModelLoadError, TokenizerNotFoundError, CLIError
        print(f"agentserve: error: {error}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `agentserve ... | head`: the reader is gone, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        sys.exit(141)


if __name__ == "__main__":
    main()
