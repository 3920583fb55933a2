"""Prompt and reply text never reach the logs, at any level, unless `log_content` opts in: chat, Responses over
HTTP and WebSocket (whose frames `websockets` logs at DEBUG), refused requests included."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

import httpx
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.content_log import FRAME_LOGGERS
from gateway.server.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import serving

SECRET = "zebra-ledger-4471"
LOGGERS = ("", "uvicorn", *FRAME_LOGGERS, "agentserve", "gateway")
CLIENT_LOGGER = "websockets.client"  # this test's own client, in the same process: not the gateway's


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []  # (logger, message with any traceback)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        self.lines.append((record.name, text))


@contextlib.contextmanager
def everything_logged() -> Iterator[Captured]:
    """Every logger the gateway and its libraries use, at DEBUG, into one handler."""
    handler = Captured()
    loggers = [logging.getLogger(name) for name in LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def run_turns(base: str) -> None:
    """A chat turn, a Responses turn over HTTP and over WebSocket, and refused requests, all carrying SECRET."""
    message = [{"role": "user", "content": f"The code is {SECRET}."}]
    httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny", "messages": message, "max_tokens": 2},
               headers={"X-Session-Id": "s"}, timeout=30).raise_for_status()
    httpx.post(f"{base}/v1/responses", json={"model": "tiny", "input": SECRET, "max_output_tokens": 2},
               timeout=30).raise_for_status()
    httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": SECRET}]}, timeout=30)
    with connect(base.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": SECRET, "max_output_tokens": 2}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.incomplete":
            pass
        ws.send(json.dumps({"type": "response.create", "input": SECRET, "temperature": SECRET}))
        assert json.loads(ws.recv(timeout=30))["type"] == "error"


def logged_with(log_content: bool) -> list[tuple[str, str]]:
    settings = GatewaySettings(model="tiny", port=free_port(), log_content=log_content)
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=128)))
    with serving(app, settings.port) as base, everything_logged() as captured:
        run_turns(base)
    return captured.lines


def test_no_prompt_or_reply_text_reaches_the_logs_by_default() -> None:
    lines = logged_with(log_content=False)
    assert lines  # the loggers did record: the requests, the uvicorn machinery
    leaked = [line for line in lines if SECRET in line[1] and line[0] != CLIENT_LOGGER]
    assert leaked == []


def test_log_content_opts_in() -> None:
    lines = logged_with(log_content=True)
    names = {name for name, text in lines if SECRET in text}
    assert "agentserve.content" in names  # the gateway's own turn log
    assert "uvicorn.error" in names  # the WebSocket frames, no longer dropped
