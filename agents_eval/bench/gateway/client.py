"""The load client of `agentserve bench gateway`, in its own process so that its work never competes with
the gateway for the GIL: `python -m agents_eval.bench.gateway.client URL`, one JSON command per stdin
line, one JSON answer per stdout line. It keeps one event loop (uvloop) and its connections across commands.

Commands (`op`): `chat` (posts bodies in a closed loop at a concurrency, each tagged `x-bench-id`), `floor`
(`GET /health` one at a time), `session` (one agent session through the harness's client, over the Responses
WebSocket or over chat completions), `stop`. `ClientProcess` is the parent's handle on it.

HTTP goes through aiohttp, as vLLM's serving benchmark does, not httpx: the same `GET /health` round trip
took 1.1-1.4 ms with httpx and 0.44-0.47 ms with aiohttp here, and whatever the client spends is counted
in the gateway's overhead (the engine path has no client), at concurrency 64 on the gateway's cores too.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
import traceback
from typing import Any

import aiohttp

from agents_eval.harness.client import ChatSession, HttpPool, WsSession
from agents_eval.harness.drive import closed_loop
from agents_eval.workloads.types import APPEND, THINK, Turn

WS, CHAT = "responses_ws", "chat_http"
Result = dict[str, Any]


class Client:
    """One aiohttp session with a connection per concurrent request, kept alive across commands."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:  # inside the running loop, as aiohttp wants
            # Idle connections are dropped before uvicorn's own 5 s keep-alive closes them: reusing one the
            # server is closing at that moment gets a reset.
            connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=4.0)
            self._http = aiohttp.ClientSession(self.url, connector=connector,
                                               timeout=aiohttp.ClientTimeout(total=120.0))
        return self._http

    async def chat(self, requests: list[Result], concurrency: int) -> Result:
        async def one(index: int) -> Result:
            request = requests[index]
            headers = {"content-type": "application/json", "x-bench-id": request["id"]}
            start = time.perf_counter()
            async with self.http.post("/v1/chat/completions", data=request["body"], headers=headers) as response:
                body = await response.read()
            elapsed = time.perf_counter() - start
            response.raise_for_status()
            return {"id": request["id"], "latency_s": elapsed, "usage": json.loads(body)["usage"]}

        return {"results": await closed_loop(len(requests), concurrency, one)}

    async def floor(self, count: int) -> Result:
        seconds = []
        for _ in range(count):
            start = time.perf_counter()
            async with self.http.get("/health") as response:
                await response.read()
            seconds.append(time.perf_counter() - start)
            response.raise_for_status()
        return {"latency_s": seconds}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def session(self, mode: str, model: str, system: str, observations: list[str], max_tokens: int) -> Result:
        """One agent session through the harness's client: over the Responses WebSocket (one connection, opened
        before turn 1's clock starts; each turn sends only its new observation), or over chat completions with
        the whole history each turn and no session id (every request its own throwaway session)."""
        turns = [Turn(None, 0.0, ({"role": "user", "content": text},), 0, max_tokens, THINK, APPEND)
                 for text in observations]
        if mode == CHAT:
            pool = HttpPool(self.url, 120.0)
            try:
                return await _run_turns(ChatSession(pool, model, system, None), turns)
            finally:
                await pool.close()
        import openai

        async with openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                                      timeout=120.0) as client, client.responses.connect() as connection:
            return await _run_turns(WsSession(connection, model, system), turns)


async def _run_turns(session: ChatSession | WsSession, turns: list[Turn]) -> Result:
    replies = [await session.send(turn) for turn in turns]
    return {"latency_s": [r.e2e_s for r in replies], "prompt_tokens": [r.prompt_tokens for r in replies],
            "cached_tokens": [r.cached_tokens for r in replies], "output_tokens": [r.output_tokens for r in replies]}


async def handle(client: Client, command: Result) -> Result:
    op = command["op"]
    if op == "chat":
        return await client.chat(command["requests"], command["concurrency"])
    if op == "floor":
        return await client.floor(command["count"])
    if op == "session":
        return await client.session(command["mode"], command["model"], command["system"], command["observations"],
                                    command["max_tokens"])
    raise ValueError(f"unknown command {op!r}")


def main(url: str) -> None:
    import uvloop

    loop = uvloop.new_event_loop()
    client = Client(url)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "stop":
            break
        try:
            answer = loop.run_until_complete(handle(client, command))
        except Exception:  # reported to the parent, which raises it; the client goes on
            answer = {"error": traceback.format_exc()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    loop.run_until_complete(client.close())
    loop.close()


class ClientProcess:
    """The parent's side: start the client, send it commands one at a time, stop it."""

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s
        self.process = subprocess.Popen([sys.executable, "-m", __name__, url], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def call(self, **command: Any) -> Result:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        ready, _, _ = select.select([stdout], [], [], self.timeout_s)
        line = stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"the bench client gave no answer to {command['op']!r} within {self.timeout_s} s")
        answer: Result = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the bench client failed:\n{answer['error']}")
        return answer

    def close(self) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> ClientProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


if __name__ == "__main__":
    main(sys.argv[1])
