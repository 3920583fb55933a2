"""Payload bytes without intermediate buffers: a tensor's memory as a few contiguous byte views (a strided
layer slice `[2, tokens, ...]` is two: its K run and its V run), and a sink that copies a payload into such
views and checksums it stride by stride, each stride while it is still in cache."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import torch

from engine.kv_cache.wire.header import CHECKSUMS, ChecksumKind

CHECKSUM_STRIDE = 256 << 10  # bytes copied then checksummed at a time: a share of L2
MAX_SEGMENTS = 64  # a tensor more fragmented than this is copied once into a contiguous one instead


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous tensor as a flat memoryview of its own memory."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy().data


def _contiguous_from(tensor: torch.Tensor) -> int:
    """The first dim from which the tensor's trailing dims are laid out as one contiguous run."""
    expected = 1
    for dim in range(tensor.dim() - 1, -1, -1):
        if tensor.shape[dim] != 1 and tensor.stride(dim) != expected:
            return dim + 1
        expected *= tensor.shape[dim]
    return 0


def _segments(tensor: torch.Tensor) -> list[memoryview] | None:
    """Views of the tensor's memory in C order, or None when it is too fragmented (or off the host)."""
    if tensor.device.type != "cpu":
        return None
    leading = _contiguous_from(tensor)
    if leading == 0:
        return [tensor_bytes(tensor)]
    if math.prod(tensor.shape[:leading]) > MAX_SEGMENTS:
        return None
    return [tensor_bytes(tensor[index]) for index in itertools.product(*map(range, tensor.shape[:leading]))]


def source_segments(tensor: torch.Tensor) -> list[memoryview]:
    """The tensor's payload bytes in C order: views of its memory, or of one contiguous copy when it is too
    fragmented to view."""
    return _segments(tensor) or [tensor_bytes(tensor.contiguous().cpu())]


def destination_segments(tensor: torch.Tensor) -> list[memoryview] | None:
    """Writable views of the tensor's memory in C order; None when writing it needs a staging copy."""
    return _segments(tensor)


def checksum_of(segments: Iterable[memoryview], kind: ChecksumKind) -> int:
    checksum, value = CHECKSUMS[kind], 0
    for segment in segments:
        value = checksum(segment, value)
    return value


class PayloadSink:
    """Fills destination views in order; every byte that lands is checksummed right after it lands."""

    def __init__(self, segments: Sequence[memoryview], kind: ChecksumKind) -> None:
        self._segments = [segment for segment in segments if segment.nbytes]
        self._checksum = CHECKSUMS[kind]
        self._index = self._offset = 0
        self.remaining = sum(segment.nbytes for segment in self._segments)
        self.value = 0

    def room(self, limit: int = CHECKSUM_STRIDE) -> memoryview:
        """The next free bytes, at most `limit`, within one segment."""
        segment = self._segments[self._index]
        return segment[self._offset:self._offset + min(limit, segment.nbytes - self._offset)]

    def landed(self, view: memoryview) -> None:
        """`view`, the start of the last `room`, now holds its bytes."""
        self.value = self._checksum(view, self.value)
        self.remaining -= view.nbytes
        self._offset += view.nbytes
        if self._offset == self._segments[self._index].nbytes and self.remaining:
            self._index, self._offset = self._index + 1, 0

    def write(self, data: memoryview) -> None:
        """Copy `data` in (no more than `remaining` bytes), stride by stride."""
        if data.nbytes > self.remaining:
            raise ValueError(f"{data.nbytes} bytes do not fit the {self.remaining} left")
        while data.nbytes:
            room = self.room(min(data.nbytes, CHECKSUM_STRIDE))
            room[:] = data[:room.nbytes]
            self.landed(room)
            data = data[room.nbytes:]
