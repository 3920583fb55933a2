"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): a key goes to the first
replica clockwise from its hash whose load is under ceil(load_factor x mean load), so a session stays on
its replica, and with it the replica's prefix cache, until that replica is overloaded or fails. Pure policy."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class BoundedLoadRing:
    def __init__(self, names: Sequence[str], virtual_nodes: int, load_factor: float) -> None:
        self.load_factor = load_factor
        points = sorted((_point(f"{name}#{i}"), name) for name in names for i in range(virtual_nodes))
        self._hashes = [p for p, _ in points]
        self._names = [n for _, n in points]
        self._distinct = len(set(names))

    def capacity(self, loads: Mapping[str, int], candidates: int) -> int:
        """Most requests one replica may hold once this one is placed."""
        total = sum(loads.values()) + 1
        return max(1, math.ceil(self.load_factor * total / max(1, candidates)))

    def walk(self, key: str) -> list[str]:
        """Every replica once, in ring order from the key's point: its home first."""
        start = bisect.bisect(self._hashes, _point(key))
        order: list[str] = []
        for offset in range(len(self._names)):
            name = self._names[(start + offset) % len(self._names)]
            if name not in order:
                order.append(name)
                if len(order) == self._distinct:
                    break
        return order

    def pick(self, key: str, loads: Mapping[str, int], allowed: set[str]) -> str | None:
        """The first allowed replica clockwise from the key under its load bound; None when none is allowed."""
        order = [name for name in self.walk(key) if name in allowed]
        if not order:
            return None
        bound = self.capacity({n: loads.get(n, 0) for n in order}, len(order))
        return next((name for name in order if loads.get(name, 0) < bound), order[0])
