"""A multi-turn agent session two ways: over the Responses WebSocket (`client.responses.connect()`, each turn
sends only its new observation with `previous_response_id`), and over HTTP chat completions resending the
whole history each turn without a session id (only block-level prefix caching helps there).

Each turn appends one tool-observation-like user message and asks for `max_output_tokens` greedy tokens.
Every session's system prompt carries its own nonce, so no session reuses another's cached blocks: turn 1
starts cold in both modes. The client process runs the sessions (the openai SDK over the WebSocket, aiohttp
for chat); latency is client-observed, send to the reply (the WebSocket's terminal event).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agents_eval.bench.gateway.client import CHAT, WS, ClientProcess
from engine.model.tokenizer import Tokenizer
from trajectory.template.types import ChatTemplate, Message

SYSTEM_PROMPT = "You are agent {nonce}, a coding agent. Call one tool per turn and read its output carefully."
FILES = ("src/app.py", "src/db/models.py", "tests/test_auth.py", "tests/test_api.py", "lib/util.ts", "README.md")
NAMES = ("login", "logout", "refresh", "parse", "render", "migrate", "search", "upload", "retry", "cache")


@dataclass(frozen=True)
class Session:
    system: str
    observations: list[str]


@dataclass(frozen=True)
class SessionRun:
    """One session's per-turn figures, in turn order."""

    latency_s: list[float]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    output_tokens: list[int]


def _tool_line(rng: random.Random) -> str:
    path, name, n, m = rng.choice(FILES), rng.choice(NAMES), rng.randint(1, 99), rng.randint(100, 999)
    return rng.choice((
        f"$ pytest {path} -q",
        f"FAILED {path}::test_{name} - AssertionError: expected {n}, got {m}",
        f"PASSED {path}::test_{name} ({n / 100:.2f}s)",
        f"{path}:{m}: error: name '{name}' is not defined",
        f"GET /api/{name}/{m} -> {rng.choice((200, 201, 404, 500))} ({n} ms)",
        f"{n} passed, {m % 7} failed, {m % 3} skipped in {n / 10:.1f}s",
    ))


def observation(rng: random.Random, tokenizer: Tokenizer, num_tokens: int) -> str:
    """Tool-output-like lines cut to about `num_tokens` tokens."""
    text = "\n".join(_tool_line(rng) for _ in range(num_tokens // 4))
    return tokenizer.decode(tokenizer.encode(text)[:num_tokens]).strip()


def make_session(tokenizer: Tokenizer, turns: int, token_range: tuple[int, int], seed: int, nonce: str) -> Session:
    rng = random.Random(seed)
    observations = [observation(rng, tokenizer, rng.randint(*token_range)) for _ in range(turns)]
    return Session(SYSTEM_PROMPT.format(nonce=nonce), observations)


def session_tokens(session: Session, template: ChatTemplate, tokenizer: Tokenizer, max_tokens: int) -> int:
    """About the tokens the last turn holds: every message, each reply `max_tokens` long."""
    messages = [Message("system", session.system)]
    for text in session.observations:
        messages += [Message("user", text), Message("assistant", "")]
    return len(tokenizer.encode(template.render(messages), add_bos=True)) + len(session.observations) * max_tokens


def run_session(client: ClientProcess, mode: str, model: str, session: Session, max_tokens: int) -> SessionRun:
    turns = client.call(op="session", mode=mode, model=model, system=session.system,
                        observations=session.observations, max_tokens=max_tokens)
    return SessionRun(turns["latency_s"], turns["prompt_tokens"], turns["cached_tokens"], turns["output_tokens"])


def run_sessions(client: ClientProcess, model: str, sessions: list[tuple[Session, Session]],
                 warm: tuple[Session, Session], max_tokens: int) -> dict[str, list[SessionRun]]:
    """A warm-up session per mode, then each pair (WebSocket, chat), the mode that goes first flipping."""
    for mode, session in zip((WS, CHAT), warm, strict=True):
        run_session(client, mode, model, session, max_tokens)
    runs: dict[str, list[SessionRun]] = {WS: [], CHAT: []}
    for index, pair in enumerate(sessions):
        order = [(WS, pair[0]), (CHAT, pair[1])]
        for mode, session in order if index % 2 == 0 else reversed(order):
            runs[mode].append(run_session(client, mode, model, session, max_tokens))
    return runs
