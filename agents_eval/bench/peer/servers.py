"""The servers `agentserve bench peer` compares, one process at a time on a free loopback port:

- llama-server: llama.cpp's own server as its users run it for many clients: continuous batching
  (`--cont-batching`) over one slot per concurrent session (`--parallel`), each slot `context` tokens
  (`--ctx-size` is their sum), the slot's prompt cache on (requests `cache_prompt`, the server's default,
  and `--cache-reuse 256` to reuse chunks of a shifted prompt), `--threads` and `--threads-batch` T;
- llama-cpp-python (optional, a second row): `python -m llama_cpp.server` on the same file, its prompt-state
  cache on (`--cache true`, RAM), logits of the last token only, queued requests waiting for the running one
  (`--interrupt_requests false`); it runs one request at a time;
- agentserve: `agentserve serve` with the configuration's environment (`settings.agentserve_env`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from agents_eval.bench.peer.settings import (
    KV_CACHE_BYTES,
    LLAMA_CPP_PYTHON,
    LLAMA_SERVER,
    PeerSettings,
    agentserve_env,
    require_llama_server,
)
from agents_eval.harness.servers.gateway import running_gateway
from agents_eval.harness.servers.process import ServerProcess, free_port, running_process
from engine.config import CONFIGS_DIR
from engine.model.gguf.package import PackagedGGUF

READY_TIMEOUT_S = 300.0
CACHE_REUSE_TOKENS = 256  # llama-server's --cache-reuse: the smallest chunk reused by shifting the KV


def gguf_file(model: str) -> Path:
    """The GGUF file agentserve's `model` loads: a built-in model's packaged file, or a .gguf path."""
    if model.endswith(".gguf"):
        return Path(model)
    spec_path = CONFIGS_DIR / "models" / f"{model}.yaml"
    spec = yaml.safe_load(spec_path.read_text()) if spec_path.is_file() else None
    if not spec or "gguf" not in spec:
        raise ValueError(f"model {model!r} has no GGUF file for llama.cpp; use a GGUF model (e.g. smollm2) "
                         "or leave the llama.cpp servers out of --configs")
    return PackagedGGUF.from_dict(spec["gguf"]).locate()


def llama_server_command(binary: Path, model_file: Path, settings: PeerSettings, port: int) -> list[str]:
    threads = str(settings.threads)
    return [str(binary), "--model", str(model_file), "--threads", threads, "--threads-batch", threads,
            "--parallel", str(settings.slots), "--ctx-size", str(settings.context * settings.slots),
            "--cont-batching", "--cache-reuse", str(CACHE_REUSE_TOKENS), "--no-webui",
            "--host", "127.0.0.1", "--port", str(port)]


def llama_cpp_python_command(model_file: Path, settings: PeerSettings, port: int) -> list[str]:
    options = {
        "model": str(model_file), "n_threads": settings.threads, "n_threads_batch": settings.threads,
        "n_ctx": settings.context, "cache": "true", "cache_type": "ram", "cache_size": KV_CACHE_BYTES,
        "logits_all": "false", "interrupt_requests": "false", "verbose": "false",
        "host": "127.0.0.1", "port": port,
    }
    return [sys.executable, "-m", "llama_cpp.server", *(f"--{k}={v}" for k, v in options.items())]


def peer_command(config: str, model_file: Path, settings: PeerSettings, port: int) -> list[str]:
    if config == LLAMA_SERVER:
        return llama_server_command(require_llama_server(), model_file, settings, port)
    return llama_cpp_python_command(model_file, settings, port)


@contextlib.contextmanager
def running_peer(config: str, model_file: Path, settings: PeerSettings,
                 log_path: Path) -> Iterator[ServerProcess]:
    port = free_port()
    env = {"OMP_NUM_THREADS": str(settings.threads)}
    ready = "/health" if config == LLAMA_SERVER else "/v1/models"  # llama-server's /health: 200 once loaded
    with running_process(peer_command(config, model_file, settings, port), port, env, log_path, ready, config,
                         READY_TIMEOUT_S) as server:
        yield server


def running_server(config: str, settings: PeerSettings, model_file: Path | None,
                   log_dir: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    log_path = log_dir / f"{config}.log"
    if config in (LLAMA_SERVER, LLAMA_CPP_PYTHON):
        if model_file is None:
            raise ValueError(f"{config} needs the model's GGUF file")
        return running_peer(config, model_file, settings, log_path)
    return running_agentserve(config, settings, log_path)


def running_agentserve(config: str, settings: PeerSettings,
                       log_path: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    return running_gateway(settings.model, agentserve_env(config, settings.threads), log_path)
