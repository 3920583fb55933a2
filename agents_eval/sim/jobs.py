"""Independent simulations (a swing's configurations, the rate searches of the table and of the placement search)
in processes of their own, `jobs` at a time, with a progress bar of those done; and what a command cost: its wall
and CPU time (its processes' included), the jobs and the host's load average at its start and end."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Any, TypeVar

Result = TypeVar("Result")


def in_processes(function: Callable[..., Result], arguments: Sequence[tuple[Any, ...]], labels: Sequence[str],
                 jobs: int, title: str) -> list[Result]:
    """`function(*arguments[i])` for every i, in the order of `arguments` (submitted in that order, so put the
    longest first); in this process when `jobs` is 1. Each result crosses a process boundary: keep it small."""
    from agents_eval.harness.drive import progress_display  # rich, only when a command runs

    results: dict[int, Result] = {}
    with progress_display() as progress:
        task = progress.add_task(title, total=len(arguments), note="")

        def done(index: int, result: Result) -> None:
            results[index] = result
            progress.update(task, advance=1, note=f"done: {labels[index]}")

        if jobs <= 1:
            for index, args in enumerate(arguments):
                done(index, function(*args))
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(function, *args): index for index, args in enumerate(arguments)}
                for future in as_completed(futures):
                    done(futures[future], future.result())
    return [results[index] for index in range(len(arguments))]


@contextmanager
def resources(jobs: int) -> Iterator[dict[str, Any]]:
    """Fills the dict it yields, on leaving: wall_s, cpu_s (this process and its waited-for children, the pool's
    processes included once it has shut down), jobs, load_average_start and load_average_end (1, 5, 15 min)."""
    used: dict[str, Any] = {"jobs": jobs, "load_average_start": os.getloadavg()}
    wall, cpu = time.monotonic(), _cpu_s()
    yield used
    used.update(wall_s=time.monotonic() - wall, cpu_s=_cpu_s() - cpu, load_average_end=os.getloadavg())


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def describe(used: dict[str, Any]) -> str:
    """One line for a report's notes."""
    start, end = (", ".join(f"{x:.2f}" for x in used[key]) for key in ("load_average_start", "load_average_end"))
    return (f"Ran in {used['wall_s']:.0f} s of wall time and {used['cpu_s']:.0f} s of CPU time (its processes "
            f"included), {used['jobs']} jobs at a time; load average (1, 5, 15 min) {start} at the start, {end} at "
            "the end.")
