"""The servers `agentserve bench peer` compares, one process at a time on a free loopback port:

- llama.cpp: llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) on the model's GGUF
  file, `--n_threads` and `--n_threads_batch` T, its prompt-state cache on (`--cache true`, RAM), logits of
  the last token only (`--logits_all false`, as agentserve), and queued requests waiting for the running
  one instead of interrupting its stream (`--interrupt_requests false`);
- agentserve: `agentserve serve` with the configuration's environment (`settings.agentserve_env`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from agents_eval.bench.peer.settings import KV_CACHE_BYTES, LLAMA_CPP, PeerSettings, agentserve_env
from agents_eval.harness.servers.gateway import running_gateway
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
                         "or leave llama.cpp out of --configs")
    return PackagedGGUF.from_dict(spec["gguf"]).locate()


def llama_cpp_command(model_file: Path, settings: PeerSettings, port: int) -> list[str]:
    options = {
        "model": str(model_file), "n_threads": settings.threads, "n_threads_batch": settings.threads,
        "n_ctx": settings.context, "cache": "true", "cache_type": "ram", "cache_size": KV_CACHE_BYTES,
        "logits_all": "false", "interrupt_requests": "false", "verbose": "false",
        "host": "127.0.0.1", "port": port,
    }
    return [sys.executable, "-m", "llama_cpp.server", *(f"--{k}={v}" for k, v in options.items())]


@contextlib.contextmanager
def running_llama_cpp(model_file: Path, settings: PeerSettings, log_path: Path) -> Iterator[ServerProcess]:
    port = free_port()
    env = {"OMP_NUM_THREADS": str(settings.threads)}
    with running_process(llama_cpp_command(model_file, settings, port), port, env, log_path, "/v1/models",
                        "llama.cpp's server", READY_TIMEOUT_S) as server:
        yield server


def running_server(config: str, settings: PeerSettings, model_file: Path | None,
                   log_dir: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    log_path = log_dir / f"{config}.log"
    if config == LLAMA_CPP:
        if model_file is None:
            raise ValueError("llama.cpp needs the model's GGUF file")
        return running_llama_cpp(model_file, settings, log_path)
    return running_gateway(settings.model, agentserve_env(config, settings.threads), log_path)
