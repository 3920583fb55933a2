"""Ids that name a request or a reply in logs and answers but open nothing (a stored response's or a session's id
is a uuid4, not one of these): a random prefix per process and a counter. Minting one makes no system call;
`uuid.uuid4()` reads the kernel's random source and gives the interpreter lock up while it does, which on the
gateway's event loop was a hand-off to the engine thread, three times per chat request."""

from __future__ import annotations

import itertools
import os


def _reseed() -> None:
    global _PREFIX, _COUNTER
    _PREFIX, _COUNTER = os.urandom(8).hex(), itertools.count()


_PREFIX, _COUNTER = "", itertools.count()
_reseed()
os.register_at_fork(after_in_child=_reseed)  # a forked replica must not repeat its parent's ids


def fresh_id(prefix: str) -> str:
    """`prefix` then 16 random hex digits (this process's) and a counter: unique, not secret."""
    return f"{prefix}{_PREFIX}{next(_COUNTER):x}"
