"""How uvicorn serves the gateway, in `agentserve serve`, the gateway benchmark and the tests alike: uvloop, the
httptools parser with one socket write per fixed-length response, and the WebSocket settings of `responses_ws`.

uvicorn writes a response's head and its body with two `transport.write` calls. On loopback each write wakes the
client, which reads the head, then sleeps until the body: two wake-ups and two reads for a 400-byte JSON reply. A
head that declares its `content-length` is held here until the body's first write, and both go in one write; if
no body write comes in the same event-loop iteration, the head goes alone. Chunked heads (streams), WebSocket
frames and the upgrade's 101 pass straight through.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.api.responses.ws import uvicorn_websocket_options
from gateway.settings import GatewaySettings

_HEAD_START, _HEAD_END, _FIXED_LENGTH = b"HTTP/1.1 ", b"\r\n\r\n", b"\r\ncontent-length: "  # uvicorn's spelling


class HeadHoldingTransport:
    """The connection's transport, with a fixed-length response's head held for its body's first write."""

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            head, self._held = self._held, None
            self._transport.write(head + bytes(data))
        elif _is_fixed_length_head(data):
            self._held = bytes(data)
            asyncio.get_running_loop().call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self.flush()
        self._transport.writelines(chunks)

    def flush(self) -> None:
        if self._held is not None:
            head, self._held = self._held, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._transport, name)


def _is_fixed_length_head(data: bytes | bytearray | memoryview) -> bool:
    return data[:9] == _HEAD_START and data[-4:] == _HEAD_END and _FIXED_LENGTH in data


class OneWriteHttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHoldingTransport(transport))  # type: ignore[arg-type]


def uvicorn_config(app: ASGIApp, settings: GatewaySettings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's settings for the gateway at `settings.host:port`; `overrides` replace any of them."""
    options: dict[str, Any] = {"host": settings.host, "port": settings.port, "loop": "uvloop",
                               "http": OneWriteHttpProtocol, "ws": "websockets-sansio",
                               **uvicorn_websocket_options(settings.limits)}
    return uvicorn.Config(app, **(options | overrides))
