"""`agentserve generate` as a user runs it: a real subprocess of the installed console command."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentserve.cli import build_parser

AGENTSERVE = str(Path(sys.executable).with_name("agentserve"))


def agentserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTSERVE, *args], capture_output=True, text=True, timeout=120, check=False)


def test_generate_json_with_repeat_shows_prefix_reuse() -> None:
    result = agentserve("generate", "--model", "tiny", "--prompt", "List the files in the repository. " * 4,
                        "--max-tokens", "8", "--repeat", "2", "--json")
    assert result.returncode == 0, result.stderr
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert set(first) == {"token_ids", "text", "num_prompt_tokens", "num_cached_tokens", "finish_reason"}
    assert first["num_cached_tokens"] == 0 and second["num_cached_tokens"] > 0
    assert first["token_ids"] == second["token_ids"]
    assert first["finish_reason"] in ("stop", "length") and 1 <= len(first["token_ids"]) <= 8


def test_generate_prompt_ids_sampled_with_seed_is_reproducible() -> None:
    args = ("generate", "--model", "tiny", "--prompt-ids", "1,40,41,42", "--max-tokens", "6",
            "--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--seed", "3", "--json")
    first, second = agentserve(*args), agentserve(*args)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["num_prompt_tokens"] == 4
    assert json.loads(first.stdout)["token_ids"] == json.loads(second.stdout)["token_ids"]


def test_generate_from_a_checkpoint_directory(make_hf_checkpoint) -> None:  # type: ignore[no-untyped-def]
    checkpoint = make_hf_checkpoint("llama")
    result = agentserve("generate", "--model", str(checkpoint), "--prompt-ids", "1,2,3", "--max-tokens", "4",
                        "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["num_prompt_tokens"] == 3


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "tiny", "--prompt", ""), "prompt is empty"),
    (("--model", "tiny", "--prompt-ids", "1," * 2048 + "1"), "the model's context is 2048 tokens"),
    (("--model", "tiny", "--prompt", "hi", "--max-tokens", "0"), "max_tokens must be at least 1"),
    (("--model", "no-such-model", "--prompt", "hi"), "no-such-model"),
    (("--model", "tiny", "--prompt", "hi", "--repeat", "0"), "--repeat must be at least 1"),
])
def test_bad_input_is_one_line_and_nonzero(args: tuple[str, ...], message: str) -> None:
    result = agentserve("generate", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_checkpoint_directory_without_weights(tmp_path: Path, make_hf_checkpoint) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "no-weights"
    empty.mkdir()
    shutil.copy(make_hf_checkpoint("llama") / "config.json", empty / "config.json")
    result = agentserve("generate", "--model", str(empty), "--prompt-ids", "1,2", "--max-tokens", "2")
    assert result.returncode == 2
    assert "safetensors" in result.stderr and str(empty) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_malformed_prompt_ids_exit_nonzero() -> None:
    result = agentserve("generate", "--model", "tiny", "--prompt-ids", "1,x,3")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_sigterm_runs_finally_blocks(tmp_path: Path) -> None:
    """A SIGTERM'd benchmark stops the servers it started: its `finally` blocks run."""
    marker = tmp_path / "cleaned"
    script = ("import time\nfrom agentserve.cli import exit_on_sigterm\nexit_on_sigterm()\n"
              "try:\n    print('ready', flush=True)\n    time.sleep(60)\n"
              f"finally:\n    open({str(marker)!r}, 'w').close()\n")
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 128 + signal.SIGTERM
    assert marker.exists()


def test_serve_imports_no_benchmark_and_no_matplotlib() -> None:
    """`agentserve serve` builds its parser and imports the gateway's server without any module of agents_eval."""
    script = ("import sys\nfrom agentserve.cli import build_parser\nargv = ['serve', '--port', '1']\n"
              "build_parser(argv).parse_args(argv)\nimport gateway.server.serve\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('agents_eval', 'matplotlib')))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_help_lists_every_command_without_importing_one() -> None:
    script = ("import sys\nfrom agentserve.cli import COMMANDS, build_parser\n"
              "print(build_parser([]).format_help())\n"
              "print(sorted({m for m, _ in COMMANDS.values()} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip().endswith("[]")
    assert all(name in result.stdout for name in ("generate", "serve", "bench", "simulate", "predictor", "monitor"))


def test_a_bench_kind_option_is_not_taken_for_a_prefix_of_the_agent_bench_options() -> None:
    argv = ["bench", "quality", "--out", "somewhere", "--batch", "5"]  # the agent bench has --batch-sessions, ...
    args = build_parser(argv).parse_args(argv)
    assert (args.kind, args.batch) == ("quality", 5)
