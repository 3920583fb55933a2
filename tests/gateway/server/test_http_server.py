"""One socket write per fixed-length response (`gateway.server.http.HeadHoldingTransport`), on a transport that
records its writes; the protocol in front of real clients is every other gateway test's (`serving`)."""

from __future__ import annotations

import asyncio
import socket

import httpx

from gateway.server.http import HeadHoldingTransport
from tests.conftest import free_port
from tests.gateway.conftest import serving

FIXED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def holding() -> tuple[HeadHoldingTransport, Recorder]:
    recorder = Recorder()
    return HeadHoldingTransport(recorder), recorder  # type: ignore[arg-type]


async def test_a_fixed_length_head_goes_out_with_its_body_in_one_write() -> None:
    transport, recorder = holding()
    transport.write(FIXED_HEAD)
    assert recorder.writes == []
    transport.write(b"{}")
    assert recorder.writes == [FIXED_HEAD + b"{}"]
    await asyncio.sleep(0)  # the end-of-iteration flush finds nothing held
    assert recorder.writes == [FIXED_HEAD + b"{}"]


async def test_a_head_whose_body_does_not_follow_goes_alone_at_the_end_of_the_iteration() -> None:
    transport, recorder = holding()
    transport.write(FIXED_HEAD)
    await asyncio.sleep(0)
    assert recorder.writes == [FIXED_HEAD]


async def test_streams_frames_and_upgrades_pass_straight_through() -> None:
    transport, recorder = holding()
    upgrade = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"
    frame = b"\x81\x05hello"
    for data in (CHUNKED_HEAD, b"5\r\nhello\r\n", upgrade, frame):
        transport.write(data)
    assert recorder.writes == [CHUNKED_HEAD, b"5\r\nhello\r\n", upgrade, frame]


async def test_closing_sends_a_held_head_first_and_the_rest_is_the_transports_own() -> None:
    transport, recorder = holding()
    transport.write(FIXED_HEAD)
    transport.close()
    assert recorder.writes == [FIXED_HEAD] and recorder.closed
    assert transport.get_extra_info("peername") == "extra peername"


def test_a_json_reply_reaches_a_raw_socket_whole_in_its_first_read() -> None:
    """Through uvicorn as the gateway configures it (a split write could still arrive whole: the unit tests above
    are the ones that pin the behaviour)."""
    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        if scope["type"] != "http":
            return
        body = b'{"ok": true}'
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})  # type: ignore[operator]

    port = free_port()
    with serving(app, port) as url:
        assert httpx.get(url).json() == {"ok": True}
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            first = conn.recv(65536)
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b'{"ok": true}')
