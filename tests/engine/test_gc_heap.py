"""A process's startup heap leaves the collector's reach (`engine.gc_heap`): the gateway's and each engine worker's."""

from __future__ import annotations

import gc
import weakref

from engine.gc_heap import freeze_startup_heap, heap_frozen


def tracked(marker: object) -> bool:
    return any(obj is marker for obj in gc.get_objects())


def test_what_startup_built_is_frozen_and_what_comes_after_is_not() -> None:
    before = [object()]
    try:
        assert freeze_startup_heap() > 0
        after = [object()]
        assert not tracked(before) and tracked(after)
    finally:
        gc.unfreeze()
    assert tracked(before)


class Node:
    pass


def test_startup_garbage_is_collected_not_frozen() -> None:
    node = Node()
    node.self = node  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    ref = weakref.ref(node)
    del node
    try:
        freeze_startup_heap()
        assert ref() is None
    finally:
        gc.unfreeze()


def test_a_heap_frozen_for_a_block_is_collectable_after_it_even_when_the_block_fails() -> None:
    before = [object()]
    try:
        with heap_frozen() as frozen:
            assert frozen > 0 and not tracked(before) and gc.get_freeze_count() > 0
            raise KeyError("the block fails")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0 and tracked(before)
