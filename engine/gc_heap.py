"""What a process built at startup (imported modules, the model's Python objects, the tokenizer's tables) is taken
out of the cyclic collector's reach with CPython's `gc.freeze()`, as vLLM does after its engine starts. In the
gateway a full collection walked about 300,000 such objects, a pause of 90-110 ms that stalled every request in
flight (`bench gateway` at 64 concurrent requests: p99 about 100 ms over the engine's in each run where one fell
inside a measured wave). An engine worker process freezes its own once its model is loaded: at the agent
benchmark's knee (swe, 18.1 sessions/s) each of the two decode workers made a full collection of 207 and 308 ms
while it served, its streams stalled throughout. Objects made afterwards are collected as before; frozen ones are
never freed, which costs nothing for what lives as long as the process."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_startup_heap() -> int:
    """Collect what startup left behind, then freeze the rest; how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def heap_frozen() -> Iterator[int]:
    """The heap built so far frozen for the block, then collectable again: a benchmark's client measures through
    it (its own full collections, 160-210 ms at the agent benchmark's knee, would pause every stream it reads), and
    the process goes on after. Yields how many objects are frozen."""
    try:
        yield freeze_startup_heap()
    finally:
        gc.unfreeze()
