"""Workers as child processes of the serving process, over a pipe each. They fork from a server process that
has already imported the engine (multiprocessing's forkserver), so a worker starts in a fraction of a second
instead of importing torch anew; the serving process itself never forks (it runs threads)."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace
from multiprocessing.connection import Connection

from engine.workers.coordinator.handles import WorkerHandle
from engine.workers.worker.process import WorkerSpec, run_worker

PRELOAD = ["engine.workers.worker.process"]


class LocalLauncher:
    def __init__(self) -> None:
        self.context = mp.get_context("forkserver")
        self.context.set_forkserver_preload(PRELOAD)

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        spec = replace(spec, node="local")
        ours, theirs = self.context.Pipe()
        process = self.context.Process(target=run_worker, args=(spec, theirs), daemon=True,
                                       name=f"agentserve-worker-{spec.worker_id}")
        process.start()
        theirs.close()
        return WorkerHandle(spec.worker_id, spec.role, process, ours, alive=False, starting=True,
                            started_at=time.monotonic(), node="local")

    def connection(self, handle: WorkerHandle) -> Connection | None:
        return handle.conn

    def new_nodes(self, occupied: set[str]) -> list[tuple[str, str]]:
        return []  # one machine: no node ever joins

    def close(self) -> None:
        pass
