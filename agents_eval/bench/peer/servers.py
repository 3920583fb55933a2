"""The servers `agentserve bench peer` compares, one process at a time on a free loopback port:

- llama-server (`harness.servers.llama_server`): llama.cpp's own server as its users run it for many clients,
  one slot per concurrent session, each slot `context` tokens;
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
from agents_eval.harness.servers.llama_server import LlamaServerOptions, running_llama_server
from agents_eval.harness.servers.process import ServerProcess, free_port, running_process
from engine.config import CONFIGS_DIR
from engine.model.gguf.package import PackagedGGUF

READY_TIMEOUT_S = 300.0


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


def llama_server_options(binary: Path, model_file: Path, settings: PeerSettings) -> LlamaServerOptions:
    """A slot of `context` tokens per session (the server's per-slot split of `--ctx-size`)."""
    return LlamaServerOptions(binary, model_file, settings.threads, settings.slots, settings.context * settings.slots,
                              unified=False)


def llama_cpp_python_command(model_file: Path, settings: PeerSettings, port: int) -> list[str]:
    options = {
        "model": str(model_file), "n_threads": settings.threads, "n_threads_batch": settings.threads,
        "n_ctx": settings.context, "cache": "true", "cache_type": "ram", "cache_size": KV_CACHE_BYTES,
        "logits_all": "false", "interrupt_requests": "false", "verbose": "false",
        "host": "127.0.0.1", "port": port,
    }
    return [sys.executable, "-m", "llama_cpp.server", *(f"--{k}={v}" for k, v in options.items())]


def running_peer(config: str, model_file: Path, settings: PeerSettings,
                 log_path: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    if config == LLAMA_SERVER:
        options = llama_server_options(require_llama_server(), model_file, settings)
        return running_llama_server(options, log_path, READY_TIMEOUT_S)
    return _running_llama_cpp_python(model_file, settings, log_path)


@contextlib.contextmanager
def _running_llama_cpp_python(model_file: Path, settings: PeerSettings, log_path: Path) -> Iterator[ServerProcess]:
    port = free_port()
    env = {"OMP_NUM_THREADS": str(settings.threads)}
    with running_process(llama_cpp_python_command(model_file, settings, port), port, env, log_path, "/v1/models",
                         LLAMA_CPP_PYTHON, READY_TIMEOUT_S) as server:
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
