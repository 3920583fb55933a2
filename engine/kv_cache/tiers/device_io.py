"""A device block's KV (every layer) as bytes and back: one kv_wire frame per layer, so a stored block
carries its shape, dtype, chained hash and checksums, and a corrupted one is refused on load."""

from __future__ import annotations

import torch

from engine.kv_cache import wire as kv_wire
from engine.model.runner import ModelRunner


class BlockCodec:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.expected = kv_wire.kv_layer_shape(runner.config.num_key_value_heads, runner.config.head_dim)

    @property
    def num_layers(self) -> int:
        return len(self.runner.kv_caches)

    def encode(self, block_hash: int, block_id: int) -> bytes:
        frames = []
        for layer in range(self.num_layers):
            kv = self.runner.read_kv(layer, [block_id], self.block_size)  # host memory, contiguous
            frames.append(kv_wire.encode(kv_wire.KVBlock(layer, 0, self.block_size, block_hash, kv)).tobytes())
        return b"".join(frames)

    def decode_into(self, data: bytes, block_hash: int, block_id: int) -> None:
        """Write a stored block into a device block; KVWireError (nothing written) when any frame is bad."""
        layers = self._decode(memoryview(data), block_hash)
        for layer, kv in enumerate(layers):
            self.runner.write_kv(layer, [block_id], 0, kv)

    def _decode(self, view: memoryview, block_hash: int) -> list[torch.Tensor]:
        layers, offset = [], 0
        for layer in range(self.num_layers):
            header = kv_wire.parse_header(view[offset:])
            block = kv_wire.decode(view[offset:offset + header.frame_nbytes], self.expected)
            if (block.layer, block.block_hash, block.token_end - block.token_start) != (layer, block_hash,
                                                                                         self.block_size):
                raise kv_wire.BadHeader(f"stored frame names layer {block.layer}, hash {block.block_hash:#x}")
            layers.append(block.tensor)
            offset += header.frame_nbytes
        if offset != len(view):
            raise kv_wire.TruncatedFrame(f"{len(view) - offset} bytes past the last layer's frame")
        return layers
