"""`agentserve bench peer` against the real `llama-server` (llama.cpp's own server, from the `peer` extra) on
SmolLM2's GGUF file, tiny sizes: slots, usage-counted output tokens, sessions measured in every round, the
servers' order rotated, goals against llama-server. Skipped, saying how to install it, where it is absent."""

from __future__ import annotations

import pytest

from agents_eval.bench.peer.bench import BenchResult, run_benchmark
from agents_eval.bench.peer.settings import (
    AGENTSERVE_QUANTIZED,
    INSTALL_HINT,
    LLAMA_SERVER,
    PeerSettings,
    llama_server_binary,
)

pytestmark = pytest.mark.skipif(llama_server_binary() is None,
                                reason=f"llama-server is not installed: {INSTALL_HINT}")

SETTINGS = PeerSettings(model="smollm2", configs=(LLAMA_SERVER, AGENTSERVE_QUANTIZED), threads=1, sessions=2,
                        turns=2, observation_tokens=24, output_tokens=3, decode_tokens=4, prefill_tokens=64,
                        repeats=1, rounds=2, context=2048)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return run_benchmark(SETTINGS, tmp_path_factory.mktemp("peer-llama-server"))


@pytest.mark.slow
def test_llama_server_runs_the_agent_sessions_in_every_round(bench: BenchResult) -> None:
    report = bench.report
    assert report["peer"] == LLAMA_SERVER
    assert report["round_order"] == [[LLAMA_SERVER, AGENTSERVE_QUANTIZED], [AGENTSERVE_QUANTIZED, LLAMA_SERVER]]
    for config in SETTINGS.configs:
        agents = report["results"][config]["agents"]
        assert agents["rounds"] == SETTINGS.rounds
        turns = agents["per_turn"]
        assert sorted((t["round"], t["session"], t["turn"]) for t in turns) == sorted(
            (r, f"peer-0-{s}", t) for r in range(SETTINGS.rounds) for s in range(SETTINGS.sessions)
            for t in range(SETTINGS.turns))
        assert all(t["output_tokens_from_usage"] for t in turns)  # counted by the server, not from chunks
        assert all(t["output_tokens"] == SETTINGS.output_tokens for t in turns)


@pytest.mark.slow
def test_llama_server_gets_its_slots_and_threads(bench: BenchResult) -> None:
    log = (bench.files.json.parent / "logs" / "round0" / f"{LLAMA_SERVER}.log").read_text()
    assert log  # the server's own log, kept beside the report
    server = bench.report["results"][LLAMA_SERVER]["server"]
    assert server["env"]["OMP_NUM_THREADS"] == "1"
    assert any(LLAMA_SERVER in note for note in bench.markdown.splitlines())


@pytest.mark.slow
def test_goals_are_judged_against_llama_server(bench: BenchResult) -> None:
    goals = bench.report["goals"]
    assert goals and all(g["peer"] == LLAMA_SERVER and g["config"] == AGENTSERVE_QUANTIZED for g in goals)
    assert all(set(g) >= {"name", "target", "bound", "measured", "met"} for g in goals)
    assert {g["metric"] for g in goals} == {"agent_turns_per_s", "agent_ttft_p99_s", "decode_tokens_per_s"}
