"""Request and reply ids (`engine.core.ids`): unique in a process, and not repeated by a forked child."""

from __future__ import annotations

import os

from engine.core.ids import fresh_id


def test_ids_are_unique_and_carry_their_prefix() -> None:
    ids = [fresh_id("req-") for _ in range(10_000)]
    assert len(set(ids)) == len(ids) and all(i.startswith("req-") for i in ids)


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without the test runner's exit handlers
        os.write(write, fresh_id("x-").encode())
        os._exit(0)
    os.close(write)
    child_id = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    os.close(read)
    parent_id = fresh_id("x-")
    assert child_id and child_id[2:18] != parent_id[2:18]  # 16 hex digits of each process's random prefix
