"""KV-level history masks are the embedded engine's: upstream, the whole (pruned) history is sent. A request
whose session had masked spans says so in the `X-Agentserve-Masks-Unapplied` response header (the tokens left
unmasked), and `agentserve:upstream_unapplied_masked_tokens_total` counts them; nothing is dropped silently.
A WebSocket's handshake answer carries `X-Agentserve-Masks: unavailable-upstream` once for all its turns."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MASKS_UNAPPLIED_HEADER = "x-agentserve-masks-unapplied"
MASKS_HEADER = "x-agentserve-masks"
UNAVAILABLE = "unavailable-upstream"


@dataclass
class MaskNote:
    """One API request's unmasked tokens; mutated by the generation, read when the headers go out."""

    unapplied_tokens: int = 0


request_note: ContextVar[MaskNote | None] = ContextVar("agentserve_mask_note", default=None)


def note_unapplied(tokens: int) -> None:
    note = request_note.get()
    if note is not None:
        note.unapplied_tokens += tokens


class MaskHeaders:
    """Pure ASGI middleware of an upstream gateway: the mask headers above on /v1 answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        note = MaskNote()
        request_note.set(note)

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start" and note.unapplied_tokens:
                header = (MASKS_UNAPPLIED_HEADER.encode(), str(note.unapplied_tokens).encode())
                message = {**message, "headers": [*message.get("headers", []), header]}
            elif message["type"] == "websocket.accept":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (MASKS_HEADER.encode(), UNAVAILABLE.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_header)
