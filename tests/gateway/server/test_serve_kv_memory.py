"""`agentserve serve --kv-cache-memory` as a user runs it: a real subprocess; its startup log states the cache in
tokens of the model."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.core.validation import read_model_config
from engine.kv_cache.sizing import kv_bytes_per_block
from tests.conftest import free_port
from tests.gateway.conftest import wait_until_ready

AGENTSERVE = str(Path(sys.executable).with_name("agentserve"))


def serve_log(tmp_path: Path, kv_cache_memory: str) -> str:
    """The log of a gateway started with `--kv-cache-memory`, once it is ready, stopped."""
    port, log_path = free_port(), tmp_path / "serve.log"
    with open(log_path, "wb") as log, subprocess.Popen(
            [AGENTSERVE, "serve", "--model", "tiny", "--port", str(port), "--kv-cache-memory", kv_cache_memory],
            stdout=log, stderr=subprocess.STDOUT) as process:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}")
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
    return log_path.read_text()


def test_a_size_sets_the_cache_over_the_environments(tmp_path: Path) -> None:
    """The suite's AGENTSERVE_ENGINE_KV_CACHE_BYTES (tests/conftest.py) is in the environment: the flag wins."""
    config, _ = read_model_config("tiny")
    blocks = (48 << 20) // kv_bytes_per_block(config, 16, torch.float32)
    assert f"KV cache: {blocks * 16:,} tokens of tiny ({blocks:,} blocks of 16" in serve_log(tmp_path, "48MiB")


def test_a_fraction_takes_that_share_of_the_available_ram(tmp_path: Path) -> None:
    line = re.search(r"KV cache: [\d,]+ tokens of tiny \(.*\)", serve_log(tmp_path, "0.2%"))
    assert line is not None and "0.2% of" in line.group() and "available RAM" in line.group()


@pytest.mark.parametrize("value", ["lots", "0", "150%", "-2GiB"])
def test_a_bad_value_is_one_line_and_exit_status_2(value: str) -> None:
    result = subprocess.run([AGENTSERVE, "serve", "--model", "tiny", "--kv-cache-memory", value],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "--kv-cache-memory" in result.stderr and "Traceback" not in result.stderr
