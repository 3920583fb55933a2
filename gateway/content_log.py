"""Prompt and reply text in logs: never, unless the `log_content` setting opts in. Opted in, each turn's new
input and its reply go to the logger `agentserve.content` at INFO. Opted out, the gateway logs no text of
its own and drops the records that carry client text from the libraries under it: the WebSocket frames
`websockets` logs at DEBUG (through uvicorn's logger)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trajectory.template_types import Message

log = logging.getLogger("agentserve.content")
FRAME_LOGGERS = ("uvicorn.error", "websockets.server")
FRAME_FORMATS = ("< %s", "> %s")  # how websockets logs a frame, in its sans-I/O and its legacy protocol alike


class DropFrames(logging.Filter):
    """Drops log records that format a WebSocket frame (its payload is the client's text). Matched by format,
    not by the frame's class: the two protocols uvicorn may pick log two different Frame classes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in FRAME_FORMATS


def configure(log_content: bool) -> None:
    """Keep frames out of the logs unless `log_content`; the loggers are the process's, shared by its apps."""
    for name in FRAME_LOGGERS:
        logger = logging.getLogger(name)
        present = [f for f in logger.filters if isinstance(f, DropFrames)]
        if log_content:
            for found in present:
                logger.removeFilter(found)
        elif not present:
            logger.addFilter(DropFrames())


def log_turn(enabled: bool, endpoint: str, session: str | None, new_input: Sequence[Message] | str,
             reply: str) -> None:
    if not enabled:
        return
    text = new_input if isinstance(new_input, str) else "\n".join(f"{m.role}: {m.content}" for m in new_input)
    log.info("%s turn of session %s\ninput: %s\nreply: %s", endpoint, session or "-", text, reply)
