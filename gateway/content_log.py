"""Prompt and reply text in logs: never, unless the `log_content` setting opts in. Opted in, each turn's new
input and its reply go to the logger `agentserve.content` at INFO. Opted out, the gateway logs no text of
its own and drops the records that carry client text from the libraries under it: the WebSocket frames
`websockets` logs at DEBUG (through uvicorn's logger)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from trajectory.template.types import Message

log = logging.getLogger("agentserve.content")
FRAME_LOGGERS = ("uvicorn.error", "websockets.server")
FRAME_FORMATS = ("< %s", "> %s")  # how websockets logs a frame, in its sans-I/O and its legacy protocol alike


_plain_factory = logging.getLogRecordFactory()


def _withholding_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """Records as usual, except a WebSocket frame's (its payload is the client's text): its argument is
    replaced. A record factory, not a logger filter, so no logger configuration can lose it; matched by
    format, since the two protocols uvicorn may pick log two different Frame classes."""
    record = _plain_factory(*args, **kwargs)
    if record.msg in FRAME_FORMATS and record.name in FRAME_LOGGERS:
        record.args = ("[frame withheld: log_content is off]",)
    return record


def configure(log_content: bool) -> None:
    """Keep frames out of the logs unless `log_content` (the process's setting, shared by its apps)."""
    logging.setLogRecordFactory(_plain_factory if log_content else _withholding_factory)


def log_turn(enabled: bool, endpoint: str, session: str | None, new_input: Sequence[Message] | str,
             reply: str) -> None:
    if not enabled:
        return
    text = new_input if isinstance(new_input, str) else "\n".join(f"{m.role}: {m.content}" for m in new_input)
    log.info("%s turn of session %s\ninput: %s\nreply: %s", endpoint, session or "-", text, reply)
