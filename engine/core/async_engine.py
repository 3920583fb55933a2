"""Async front of the engine for the gateway: the step loop runs on its own thread (torch releases the
GIL), and each request is an async iterator of `RequestOutput` deltas. Leaving the iterator early
(a cancelled task, a client gone) aborts the request, which frees its KV blocks at the next step."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from engine.core.ids import fresh_id
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import RequestError, SamplingParams
from engine.core.sequence import SessionRef
from engine.core.stats import AgentSignals, EngineStats, WorkerReport
from engine.core.validation import Prompt
from engine.model.mask import MaskedSpan, QuerySelection
from engine.model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.capacity.loop import CapacityLoop

log = logging.getLogger(__name__)

_Item = RequestOutput | BaseException
_T = TypeVar("_T")


def _settle(future: asyncio.Future[_T], result: _T | None, error: BaseException | None) -> None:
    if future.done():  # the caller gave up waiting
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


def _put_all(batch: list[tuple[asyncio.Queue[_T], _T]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


class EngineDeadError(RuntimeError):
    """The engine loop failed or was shut down while the request was running."""


class ServingEngine(Protocol):
    """What the gateway serves: the colocated `LLMEngine` or the `WorkerEngine`."""

    tokenizer: Tokenizer | None
    checkpoint: Path | None
    max_model_len: int
    steps_when_idle: bool  # its step also waits on its workers' reports: keep stepping with nothing to run

    @property
    def capacity(self) -> CapacityLoop | None:
        """The capacity controller of a disaggregated engine."""

    def tokenize(self, prompt: Prompt) -> list[int]: ...
    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]: ...
    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
                    masked_spans: Sequence[MaskedSpan] = (), session: SessionRef | None = None,
                    selection: QuerySelection | None = None) -> str: ...
    def abort(self, request_id: str) -> object: ...
    def has_unfinished(self) -> bool: ...
    def step(self) -> list[RequestOutput]: ...
    def wakeup(self) -> None: ...
    def set_session_ttl(self, key: str, ttl_s: float) -> bool: ...
    def stats(self) -> EngineStats: ...
    def kv_tier_stats(self) -> dict[str, Any] | None: ...  # KV tier counters; None: no tiers below the device
    def worker_reports(self) -> list[WorkerReport]: ...  # each worker process's load; []: no worker processes
    def update_signals(self, signals: AgentSignals) -> None: ...
    def shutdown(self, deadline_s: float = 10.0) -> object: ...


class AsyncLLMEngine:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self._commands: SimpleQueue[Callable[[], object]] = SimpleQueue()  # run for effect
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[_Item]]] = {}
        self._wake = threading.Event()
        # A wake-up is a write the waking thread gives the interpreter lock up for, and the woken thread takes
        # it: at 64 requests in a burst, one per submit was a lock hand-off per request on the event loop.
        self._wake_pending = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentserve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop thread, then the engine (its worker processes, if any)."""
        self._stopping.set()
        self._wake.set()
        self.engine.wakeup()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_all(EngineDeadError("engine shut down"))
        self.engine.shutdown(timeout)

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
                       masked_spans: Sequence[MaskedSpan] = (), session: SessionRef | None = None,
                       every_token: bool = True, selection: QuerySelection | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs; raises RequestError before the first output on bad input. Without
        `every_token`, only two: the first token's and the last, which carries every delta since the first
        (`SamplingParams.every_token`, held where the tokens are made)."""
        if not every_token and params.every_token:
            params = dataclasses.replace(params, every_token=False)
        if self._stopping.is_set():
            raise EngineDeadError("engine is shut down")
        token_ids = self.engine.validate(prompt, params)
        request_id = request_id or fresh_id("req-")
        if request_id in self._streams:
            raise RequestError(f"request id {request_id!r} is already running")
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), queue)
        self._submit(lambda: self._add(token_ids, params, request_id, masked_spans, session, selection))
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._submit(lambda: self.engine.abort(request_id))

    def call(self, fn: Callable[[ServingEngine], object]) -> None:
        """Run fn(engine) on the engine thread between two steps."""
        self._submit(lambda: fn(self.engine))

    async def query(self, fn: Callable[[ServingEngine], _T]) -> _T:
        """fn(engine) run on the engine thread between two steps; its result (or its exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def run() -> None:
            try:
                result = fn(self.engine)
            except Exception as error:  # handed to the awaiting caller
                loop.call_soon_threadsafe(_settle, future, None, error)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self._submit(run)
        return await future

    def _submit(self, command: Callable[[], object]) -> None:
        self._commands.put(command)
        if not self._wake_pending:  # else the thread was woken and has not drained the commands since
            self._wake_pending = True
            self._wake.set()
            self.engine.wakeup()

    def _add(self, token_ids: list[int], params: SamplingParams, request_id: str,
             masked_spans: Sequence[MaskedSpan], session: SessionRef | None,
             selection: QuerySelection | None = None) -> None:
        try:
            self.engine.add_request(token_ids, params, request_id, masked_spans=masked_spans, session=session,
                                    selection=selection)
        except ValueError as error:
            self._deliver(request_id, error)
        except RuntimeError as error:  # no worker left to take it
            self._deliver(request_id, EngineDeadError(str(error)))

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._run_commands()
            if not self.engine.has_unfinished() and not self.engine.steps_when_idle:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as error:  # the loop must survive: fail the running requests, go on
                log.exception("engine step failed")
                self._abort_all(EngineDeadError(f"engine step failed: {error}"))
                continue
            self._deliver_step(outputs)

    def _run_commands(self) -> None:
        self._wake_pending = False  # before draining: a command put after this wakes the thread again
        while True:
            try:
                command = self._commands.get_nowait()
            except Empty:
                return
            command()

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        self._deliver_all([(out.request_id, out) for out in outputs])

    def _deliver(self, request_id: str, item: _Item) -> None:
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, _Item]]) -> None:
        """Items to their streams, in one callback per event loop: each callback is a write to that loop's
        wake-up pipe and a thread hand-off, which at 64 streams cost more than the outputs themselves."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[_Item], _Item]]] = {}
        for request_id, item in items:
            stream = self._streams.get(request_id)
            if stream is not None:
                batches.setdefault(stream[0], []).append((stream[1], item))
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
                for request_id in [rid for rid, (owner, _) in list(self._streams.items()) if owner is loop]:
                    self._streams.pop(request_id, None)

    def _abort_all(self, error: BaseException) -> None:
        for request_id in list(self._streams):
            self.engine.abort(request_id)
            self._deliver(request_id, error)

    def _fail_all(self, error: BaseException) -> None:
        for request_id in list(self._streams):
            self._deliver(request_id, error)
