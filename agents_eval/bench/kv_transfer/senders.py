"""The sending side, a child process: a transport's sender, or one of the two socket baselines."""

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
from engine.kv_wire import layer_runs, tensor_bytes
from engine.transport import make_transport
from engine.transport.base import KVSender

LENGTH = struct.Struct("!Q")


class BlockSender:
    """Sends each layer as the engine's prefill side does: its blocks as runs of consecutive ones
    (`kv_wire.layer_runs`, as many as the transport's frames hold), one frame per run."""

    def __init__(self, sender: KVSender, block_tokens: int) -> None:
        self.sender, self.block_tokens = sender, block_tokens

    def send(self, cache: Cache) -> None:
        for layer, kv in enumerate(cache):
            hashes = block_hashes(layer, kv.shape[1], self.block_tokens)
            self.sender.send_many(layer_runs(layer, kv, hashes, self.block_tokens, self.sender.coalesce_bytes))

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


def sender_process(settings: KVBenchSettings, control: Connection) -> None:
    """The child: ("connect", method, address, block_tokens), ("go",) sends the request, ("close",), ("stop",)."""
    torch.set_num_threads(1)
    cache = make_cache(settings)
    sender: BlockSender | SocketSender | None = None
    while (command := control.recv())[0] != "stop":
        if command[0] == "connect" and command[1] in (NAIVE, RAW):
            sender = SocketSender(command[1], command[2], command[3])
        elif command[0] == "connect":
            sender = BlockSender(make_transport(command[1], settings.transport).connect(command[2]), command[3])
        elif command[0] == "close" and sender is not None:
            sender.close()
        elif sender is not None:
            sender.send(cache)
        control.send("ok")
