"""The sending side, a child process: a transport's sender, or one of the two socket baselines. Like the
engine's prefill side, it keeps the KV in memory its transport registered where the transport can (shm:
the receiver then pulls each frame straight from it, one copy), and a send ends once the receiver no
longer reads that memory."""

from __future__ import annotations

import pickle
import socket
import struct
from multiprocessing.connection import Connection

import torch

from agents_eval.bench.kv_transfer.settings import (
    NAIVE,
    RAW,
    Cache,
    KVBenchSettings,
    block_hashes,
    blocks_of,
    make_cache,
)
from engine.kv_cache.wire import layer_runs, tensor_bytes
from engine.transport import make_transport
from engine.transport.base import KVSender, Transport

LENGTH = struct.Struct("!Q")
RELEASE_TIMEOUT_S = 60.0


class BlockSender:
    """Sends each layer as the engine's prefill side does: its blocks as runs of consecutive ones
    (`kv_wire.layer_runs`, as many as the transport's frames hold), one frame per run."""

    def __init__(self, sender: KVSender, block_tokens: int) -> None:
        self.sender, self.block_tokens = sender, block_tokens

    def send(self, cache: Cache) -> None:
        for layer, kv in enumerate(cache):
            hashes = block_hashes(layer, kv.shape[1], self.block_tokens)
            self.sender.send_many(layer_runs(layer, kv, hashes, self.block_tokens, self.sender.coalesce_bytes))
        if not self.sender.flush(RELEASE_TIMEOUT_S):
            raise RuntimeError("the receiver did not release the sent blocks")

    def close(self) -> None:
        self.sender.close()


class SocketSender:
    def __init__(self, method: str, port: int, block_tokens: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.naive, self.block_tokens = method == NAIVE, block_tokens

    def send(self, cache: Cache) -> None:
        for layer, kv in enumerate(cache):
            if not self.naive:
                self.sock.sendall(tensor_bytes(kv))
                continue
            for block in blocks_of(layer, kv, self.block_tokens):  # clone: pickling a view ships its whole storage
                data = pickle.dumps((block.layer, block.token_start, block.token_end, block.tensor.clone()))
                self.sock.sendall(LENGTH.pack(len(data)) + data)

    def close(self) -> None:
        self.sock.close()


def registered_cache(transport: Transport, cache: Cache) -> Cache:
    """The cache copied into memory the transport registered, or as it is where the transport has none."""
    shared = transport.shared_tensors([(tuple(kv.shape), kv.dtype) for kv in cache])
    if shared is None:
        return cache
    for target, kv in zip(shared, cache, strict=True):
        target.copy_(kv)
    return shared


def sender_process(settings: KVBenchSettings, control: Connection) -> None:
    """The child: ("connect", method, address, block_tokens), ("go",) sends the request, ("close",), ("stop",)."""
    torch.set_num_threads(1)
    cache = make_cache(settings)
    transports: dict[str, tuple[Transport, Cache]] = {}
    sender: BlockSender | SocketSender | None = None
    source = cache
    try:
        while (command := control.recv())[0] != "stop":
            if command[0] == "connect" and command[1] in (NAIVE, RAW):
                sender, source = SocketSender(command[1], command[2], command[3]), cache
            elif command[0] == "connect":
                if command[1] not in transports:
                    transport = make_transport(command[1], settings.transport)
                    transports[command[1]] = transport, registered_cache(transport, cache)
                transport, source = transports[command[1]]
                sender = BlockSender(transport.connect(command[2]), command[3])
            elif command[0] == "close" and sender is not None:
                sender.close()
            elif sender is not None:
                sender.send(source)
            control.send("ok")
    finally:
        for transport, _ in transports.values():
            transport.close()
