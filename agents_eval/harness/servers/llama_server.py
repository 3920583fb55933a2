"""llama.cpp's `llama-server` as a child process, as its users run it for many concurrent clients: continuous
batching over `parallel` slots sharing one KV pool of `context` tokens (`--kv-unified`; without `unified`, each
slot gets `context / parallel` of its own, the server's default), the slots' prompt
cache on (`cache_prompt` is the server's default; `--cache-reuse` reuses chunks of a shifted prompt), `threads`
for decode and batch. Ready when `GET /health` answers 200 (the model loaded)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agents_eval.harness.servers.process import READY_TIMEOUT_S, ServerProcess, free_port, running_process

CACHE_REUSE_TOKENS = 256


@dataclass(frozen=True)
class LlamaServerOptions:
    binary: Path
    model_file: Path  # the GGUF file
    threads: int
    parallel: int  # slots: at least the concurrent sessions
    context: int  # tokens of KV, all slots together
    unified: bool = True  # one pool the slots share, else a fixed share per slot

    def command(self, port: int) -> list[str]:
        threads = str(self.threads)
        return [str(self.binary), "--model", str(self.model_file), "--threads", threads, "--threads-batch", threads,
                "--parallel", str(self.parallel), "--ctx-size", str(self.context),
                *(["--kv-unified"] if self.unified else []),
                "--cont-batching", "--cache-reuse", str(CACHE_REUSE_TOKENS), "--no-webui",
                "--host", "127.0.0.1", "--port", str(port)]

    def deployment(self) -> dict[str, object]:
        return {"threads": self.threads, "parallel": self.parallel, "kv_tokens": self.context,
                "model_file": self.model_file.name}


@contextlib.contextmanager
def running_llama_server(options: LlamaServerOptions, log_path: Path,
                         ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[ServerProcess]:
    port = free_port()
    env = {"OMP_NUM_THREADS": str(options.threads)}
    with running_process(options.command(port), port, env, log_path, "/health", "llama-server",
                         ready_timeout_s) as server:
        yield server
