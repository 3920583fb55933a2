"""`agentserve generate`: one request through the engine, its text or JSON printed."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams

if TYPE_CHECKING:
    from engine.workers.coordinator.worker_engine import WorkerEngine


class CLIError(ValueError):
    """Bad command-line input."""


def _prompt_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CLIError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
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


def _engine(args: argparse.Namespace) -> LLMEngine | WorkerEngine:
    if not args.disaggregated:
        return LLMEngine(args.model, EngineSettings())
    from engine.workers.coordinator.worker_engine import (
        WorkerEngine,  # worker processes, transports: only when asked
    )
    from engine.workers.deployment import DeploymentSettings

    deployment = DeploymentSettings(**({"transport": args.transport} if args.transport else {}))
    return WorkerEngine(args.model, EngineSettings(), deployment)


def _as_json(result: Completion) -> dict[str, object]:
    return {
        "token_ids": result.token_ids,
        "text": result.text,
        "num_prompt_tokens": result.num_prompt_tokens,
        "num_cached_tokens": result.num_cached_tokens,
        "finish_reason": result.finish_reason,
    }
