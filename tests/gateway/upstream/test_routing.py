"""Upstream routing and failover against real upstream processes: `agentserve serve --model tiny` gateways on
loopback (and llama.cpp's server where llama-cpp-python is installed), with a gateway in front of them."""

from __future__ import annotations

import importlib.util
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.settings import GatewaySettings
from gateway.upstream.settings import UpstreamPoolSettings
from tests.conftest import free_port
from tests.gateway.conftest import GatewayProcess, running_gateway
from tests.gateway.upstream.test_protocol import session_homed_on

pytestmark = pytest.mark.slow
OBSERVATION = " ".join(f"line {i}: the build log says step {i} finished without errors." for i in range(40))


def routed(url: str) -> dict[str, float]:
    """Successful tries per upstream replica, from the front gateway's metrics."""
    text = httpx.get(url + "/metrics").text
    pattern = r'agentserve:upstream_requests_total\{outcome="ok",upstream="([^"]+)"\} ([0-9.]+)'
    return {name: float(value) for name, value in re.findall(pattern, text)}


def metric(url: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", httpx.get(url + "/metrics").text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def chat_turns(url: str, session: str, turns: int) -> list[openai.types.chat.ChatCompletion]:
    messages: list[dict[str, str]] = [{"role": "user", "content": "Read this log. " + OBSERVATION}]
    replies = []
    with openai.OpenAI(base_url=url + "/v1", api_key="none", default_headers={"X-Session-Id": session}) as client:
        for turn in range(turns):
            reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)  # type: ignore[arg-type]
            replies.append(reply)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                         {"role": "user", "content": f"Turn {turn}: and then?"}]
    return replies


@pytest.fixture(scope="module")
def upstreams(gateway_process: GatewayProcess) -> list[str]:
    return [gateway_process()[1] + "/v1" for _ in range(2)]


def front(upstreams: list[str], **pool: object) -> object:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=16, upstreams=upstreams,
                               upstream=UpstreamPoolSettings(**pool))  # type: ignore[arg-type]
    return running_gateway(settings)


def test_a_sessions_turns_stay_on_one_replica_and_reuse_its_prefix_cache(upstreams: list[str]) -> None:
    sessions = [session_homed_on(upstreams, home) for home in upstreams]  # one session homed on each
    with front(upstreams) as url:  # type: ignore[attr-defined]
        for session, home in zip(sessions, upstreams, strict=True):
            before = routed(url)
            replies = chat_turns(url, session, 3)
            after = routed(url)
            moved = {name: after.get(name, 0) - before.get(name, 0) for name in upstreams}
            assert moved == {name: 3.0 if name == home else 0.0 for name in upstreams}
            cached = [r.usage.prompt_tokens_details.cached_tokens for r in replies]  # type: ignore[union-attr]
            assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached


def test_a_replica_killed_between_turns_moves_its_session(gateway_process: GatewayProcess,
                                                          upstreams: list[str]) -> None:
    process, doomed_url = gateway_process()
    pair = [upstreams[0], doomed_url + "/v1"]
    session = session_homed_on(pair, pair[1])
    with front(pair, health_interval_s=3600) as url:  # type: ignore[attr-defined]
        chat_turns(url, session, 1)
        assert routed(url).get(pair[1]) == 1.0
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        replies = chat_turns(url, session, 3)  # the first of these finds the replica gone
        assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
        assert metric(url, "agentserve:upstream_failovers_total") == 1.0
        assert routed(url) == {pair[0]: 3.0, pair[1]: 1.0}


@pytest.fixture(scope="module")
def llama_cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("sse_starlette") is None:
        print("llama.cpp upstream test skipped: llama-cpp-python (with its server extra) is not installed")
        pytest.skip("llama-cpp-python's server is not installed")
    from agents_eval.bench.peer.servers import gguf_file

    port = free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "wb")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "llama_cpp.server", f"--model={gguf_file('smollm2')}", "--n_ctx=2048",
               "--n_threads=1", "--interrupt_requests=false", "--host=127.0.0.1", f"--port={port}", "--verbose=false"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_models(f"http://127.0.0.1:{port}", process)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _wait_for_models(url: str, process: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"llama.cpp's server exited with {process.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("llama.cpp's server did not start")


def test_chat_and_responses_through_llama_cpp(llama_cpp_server: str) -> None:
    settings = GatewaySettings(model="smollm2", port=free_port(), default_max_tokens=8, upstreams=[llama_cpp_server])
    with running_gateway(settings) as url, openai.OpenAI(base_url=url + "/v1", api_key="none") as client:
        chat = client.chat.completions.create(model="smollm2", max_tokens=8,
                                              messages=[{"role": "user", "content": "Say hi."}])
        first = client.responses.create(model="smollm2", input="Name a colour.", max_output_tokens=8)
        second = client.responses.create(model="smollm2", input="Another one.", previous_response_id=first.id,
                                         max_output_tokens=8)
    assert chat.choices[0].message.content
    assert first.status in ("completed", "incomplete") and second.status in ("completed", "incomplete")
    assert second.output_text
