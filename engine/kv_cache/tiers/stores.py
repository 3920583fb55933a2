"""Block stores behind one interface: files in a folder (local disk, or tmpfs for the node's host tier) and
Redis. A store keeps opaque bytes under a key; `engine.kv_cache.keys` names blocks. Pure I/O, no torch.

A store that cannot be reached raises StoreUnavailable; one that has no room raises StoreFull. Callers
(engine.kv_cache.tiers.chain) turn both into a skipped tier, never a failed request.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol

import redis


class StoreUnavailable(Exception):
    """The store cannot be reached (Redis down, folder gone)."""


class StoreFull(Exception):
    """The store has no room for another block (its byte limit, or a full disk)."""


class BlockStore(Protocol):
    name: str

    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def held(self) -> tuple[int, int]: ...  # blocks, bytes this store holds (as far as this process knows)
    def close(self) -> None: ...  # its connections; what it stored stays


class FileStore:
    """One file per block; written under a temporary name and renamed, so readers never see half a block."""

    def __init__(self, name: str, root: Path, max_bytes: int | None = None) -> None:
        self.name, self.root, self.max_bytes = name, root, max_bytes
        try:
            root.mkdir(parents=True, exist_ok=True)
            sizes = [path.stat().st_size for path in root.glob("*.kvb")]
        except OSError as error:
            raise StoreUnavailable(f"{name} store at {root}: {error}") from error
        self.num_blocks, self.num_bytes = len(sizes), sum(sizes)

    def _path(self, key: str) -> Path:
        return self.root / f"{key.replace(':', '_').replace('/', '_')}.kvb"

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StoreUnavailable(f"{self.name} store: {error}") from error

    def put(self, key: str, data: bytes) -> None:
        if self.max_bytes is not None and self.num_bytes + len(data) > self.max_bytes:
            raise StoreFull(f"{self.name} store holds {self.num_bytes} of {self.max_bytes} bytes")
        path = self._path(key)
        existed = path.exists()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            full = error.errno in (errno.ENOSPC, errno.EDQUOT)
            raise (StoreFull if full else StoreUnavailable)(f"{self.name} store: {error}") from error
        if not existed:
            self.num_blocks += 1
            self.num_bytes += len(data)

    def contains(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as error:
            raise StoreUnavailable(f"{self.name} store: {error}") from error
        self.num_blocks -= 1
        self.num_bytes -= size

    def held(self) -> tuple[int, int]:
        return self.num_blocks, self.num_bytes

    def close(self) -> None:
        """Nothing to close: each call opens and closes its file."""


class RedisStore:
    """Blocks as Redis strings with a time-to-live; shared by every replica that uses the same Redis."""

    def __init__(self, url: str, ttl_s: int, timeout_s: float = 2.0) -> None:
        self.name = "redis"
        self.ttl_s = ttl_s
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.num_blocks = self.num_bytes = 0  # written by this process

    def get(self, key: str) -> bytes | None:
        try:
            value = self.client.get(key)
        except redis.RedisError as error:
            raise StoreUnavailable(f"redis store: {error}") from error
        return value if isinstance(value, bytes) else None

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.set(key, data, ex=self.ttl_s)
        except redis.exceptions.ResponseError as error:  # OOM under maxmemory
            raise StoreFull(f"redis store: {error}") from error
        except redis.RedisError as error:
            raise StoreUnavailable(f"redis store: {error}") from error
        self.num_blocks += 1
        self.num_bytes += len(data)

    def contains(self, key: str) -> bool:
        try:
            return bool(self.client.exists(key))
        except redis.RedisError as error:
            raise StoreUnavailable(f"redis store: {error}") from error

    def delete(self, key: str) -> None:
        try:
            self.client.delete(key)
        except redis.RedisError as error:
            raise StoreUnavailable(f"redis store: {error}") from error

    def held(self) -> tuple[int, int]:
        return self.num_blocks, self.num_bytes

    def close(self) -> None:
        self.client.close()
