"""One engine worker process. Every worker can do either job: a `Submit` with a decode address is
prefilled here and its KV streamed there layer by layer; an `AcceptHandoff` is decoded here; a plain
`Submit` runs whole (colocated). The role only steers the coordinator's routing, so `SetRole` takes
effect after the current step without reloading anything, and requests already here finish here."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from engine.core.sequence import SessionRef
from engine.gc_heap import freeze_startup_heap
from engine.kv_cache.wire import KVWireError
from engine.transport import make_transport
from engine.transport.base import KVReceiver, Transport, TransportSettings
from engine.workers import messages as m
from engine.workers.worker.handoff import accept_handoff, release, take_handoff
from engine.workers.worker.kv_assembly import KVAssembler
from engine.workers.worker.kv_stream import LayerStreamer, TransferStats

log = logging.getLogger(__name__)
IDLE_POLL_S = 0.002  # idle while KV is on its way here or being read from here: frames wake no pipe
IDLE_WAIT_S = 0.05  # idle otherwise: every input is a command on its pipe, which ends the wait at once
EXPECT_KV_S = 60.0  # an ExpectKV whose hand-off never came (its prefill worker died) stops the poll after this
LOST_COORDINATOR = (EOFError, BrokenPipeError, ConnectionResetError)  # its pipe (or connection) ended


@dataclass
class WorkerSpec:
    worker_id: int
    model: str
    engine: EngineSettings
    transport: str
    role: str
    num_threads: int | None  # torch intra-op threads; None: torch's default (every core)
    kv_timeout_s: float
    kv_fault: str | None = None  # failure testing only: see kv_stream.FAULTS
    report_interval_s: float = 0.1  # how often a busy worker sends its Load
    peers: tuple[int, ...] = ()  # the other workers: each gets a KV receiver of its own here
    kv_host: str | None = None  # where its KV receivers listen (tcp, rdma); None: the transport's setting
    node: str = "local"  # where it runs: "local", or its Ray node id
    nice: int = 0  # added to the process's niceness before it loads the model (DeploymentSettings.worker_nice)

    def engine_settings(self) -> EngineSettings:
        """The engine's settings with the worker's own threads (the deployment's `threads_per_worker`): the
        engine's `num_threads` (`AGENTSERVE_ENGINE_NUM_THREADS`, the colocated engine's) would otherwise give every
        worker that many, two workers of 2 threads on a 2-core host running 4."""
        return self.engine.model_copy(update={"num_threads": self.num_threads})


def run_worker(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point."""
    if spec.nice:
        os.nice(spec.nice)
    engine = LLMEngine(spec.model, spec.engine_settings())
    transport = make_transport(spec.transport, TransportSettings(host=spec.kv_host) if spec.kv_host else None)
    worker = Worker(spec, engine, conn, transport)
    addresses = {peer: worker.listen() for peer in spec.peers}
    frozen = freeze_startup_heap()  # a full collection over the model's and torch's objects stalls every stream
    conn.send(m.Ready(spec.worker_id, os.getpid(), spec.role, addresses, spec.node, frozen))
    try:
        worker.loop()
    finally:
        worker.streamer.close()
        for receiver in worker.receivers:
            receiver.close()
        engine.shutdown()
        transport.close()


class Worker:
    def __init__(self, spec: WorkerSpec, engine: LLMEngine, conn: Connection, transport: Transport) -> None:
        self.spec, self.engine, self.conn, self.transport = spec, engine, conn, transport
        self.receivers: list[KVReceiver] = []
        by_reference = engine.runner.place_kv_caches(transport.shared_tensors)  # shm: its views go by reference
        self.streamer = LayerStreamer(engine, transport.connect, spec.kv_fault, by_reference)
        self.role = spec.role
        self.assembler = KVAssembler(engine.config.num_hidden_layers, engine.settings.block_size, spec.kv_timeout_s)
        self.stopping = False
        self.handoff_sessions: dict[str, SessionRef] = {}  # prefill-only request -> session its decoder pins
        self.releasing: dict[str, TransferStats] = {}  # sent requests whose blocks a receiver may still read
        self.expected: dict[str, float] = {}  # request -> monotonic deadline: its KV is streaming here
        self.last_report = 0.0
        self.unreported = False  # it stepped since its last Load report

    @property
    def idle_wait_s(self) -> float:
        """How long an idle turn waits for a command before it looks at its receivers and pins again: KV frames
        arrive with no command, so it polls while a transfer to it was announced (`ExpectKV`, then the hand-off's
        assembly) or a receiver may still read its own sent blocks."""
        now = time.monotonic()
        self.expected = {request_id: due for request_id, due in self.expected.items() if due > now}
        transferring = self.expected or self.assembler.waiting or self.releasing
        return IDLE_POLL_S if transferring else IDLE_WAIT_S

    def listen(self) -> str:
        """A new KV receiver, for one sending peer (a ring has one sender); its address."""
        address, receiver = self.transport.listen()
        self.receivers.append(receiver)
        return address

    def loop(self) -> None:
        try:
            while not self.stopping:
                self._turn()
            self.conn.send(m.Stopped(self.assembler.counters))
        except LOST_COORDINATOR:  # the serving process is gone: nobody left to serve
            log.warning("worker %d lost its coordinator; stopping", self.spec.worker_id)

    def _turn(self) -> None:
        busy = self.engine.has_unfinished()
        self._commands(wait_s=0.0 if busy else self.idle_wait_s)
        if not busy and self.engine.expire_pins():
            self.unreported = True  # the released blocks show in its next Load
        self._receive_kv()
        self._take_assembled()
        self._release_transferred()
        if self.engine.has_unfinished():
            self._dispatch(self.engine.step(self.streamer.on_layer))
            self.unreported = True
        self._report_load()

    def _report_load(self) -> None:
        """Every report interval while busy, and at once when it turns idle."""
        now = time.monotonic()
        due = not self.engine.has_unfinished() or now - self.last_report >= self.spec.report_interval_s
        if self.unreported and due:
            stats = replace(self.engine.stats(), kv_transfers=self.assembler.counters.outcomes())
            self.conn.send(m.Load(self.spec.worker_id, stats, self.engine.kv_tier_stats()))
            self.last_report, self.unreported = now, False

    def _commands(self, wait_s: float) -> None:
        while self.conn.poll(wait_s):
            self._handle(self.conn.recv())
            wait_s = 0.0

    def _handle(self, command: m.Command) -> None:
        if isinstance(command, m.Submit | m.Abort | m.AcceptHandoff):
            self.unreported = True  # its load changes: the coordinator hears of it even without a step
        if isinstance(command, m.Submit):
            self._submit(command)
        elif isinstance(command, m.ExpectKV):
            self.expected[command.request_id] = time.monotonic() + EXPECT_KV_S
        elif isinstance(command, m.AcceptHandoff):
            self.expected.pop(command.handoff.request_id, None)
            self.assembler.expect(command.handoff)
        elif isinstance(command, m.Abort):
            self.expected.pop(command.request_id, None)
            self._abort(command.request_id)
        elif isinstance(command, m.SetRole):
            self.role = command.role
            self.conn.send(m.RoleChanged(command.role, command.sent_at, time.time()))
        elif isinstance(command, m.SetSessionTTL):
            self.engine.set_session_ttl(command.key, command.ttl_s)
        elif isinstance(command, m.Ping):
            self.conn.send(m.Pong(command.sent_at, time.time()))
        elif isinstance(command, m.Shutdown):
            self.stopping = True
        elif isinstance(command, m.InjectKVFault):
            self.streamer.set_fault(command.fault)
        elif isinstance(command, m.CountersQuery):
            self.conn.send(m.Counters(self.spec.worker_id, self.assembler.counters))
        elif isinstance(command, m.ResetPrefixCache):
            self.conn.send(m.PrefixCacheReset(self.spec.worker_id, self.engine.reset_prefix_cache()))
        elif isinstance(command, m.Listen):
            self.conn.send(m.Listening(self.spec.worker_id, command.peer_id, self.listen()))

    def _submit(self, command: m.Submit) -> None:
        prefill_only = command.decode_address is not None
        if prefill_only:
            self.streamer.targets[command.request_id] = str(command.decode_address)
            if command.session is not None:
                self.handoff_sessions[command.request_id] = command.session
        self.engine.add_request(command.token_ids, command.params, command.request_id,
                                masked_spans=command.masked_spans, prefill_only=prefill_only,
                                session=None if prefill_only else command.session, selection=command.selection)

    def _abort(self, request_id: str) -> None:
        self.handoff_sessions.pop(request_id, None)
        out = self.engine.abort(request_id)
        self.streamer.targets.pop(request_id, None)
        self._release_when_read(request_id, self.streamer.stats.pop(request_id, None))
        if out is not None:
            self.conn.send(m.Outputs([out]))

    def _receive_kv(self) -> None:
        for receiver in self.receivers:
            self._drain_receiver(receiver)

    def _drain_receiver(self, receiver: KVReceiver) -> None:
        """Frames sent by reference stay views of the sender's memory until their request is assembled."""
        while True:
            try:
                held = receiver.recv_held(0.0)
            except KVWireError as error:
                self.assembler.reject(type(error).__name__)
                continue
            if held is None:
                return
            self.assembler.add(held.block, release=held.release)

    def _take_assembled(self) -> None:
        for done in self.assembler.ready():
            used = accept_handoff(self.engine, done.handoff, done.frames)
            done.release()  # copied into this worker's blocks (or given up): the sender may reuse its own
            if not used:
                self.assembler.counters.recomputed += 1

    def _release_when_read(self, request_id: str, stats: TransferStats | None) -> None:
        """Free a request's blocks now, or once no receiver reads them any more (`_release_transferred`)."""
        if stats is None or stats.released():
            release(self.engine, request_id)
        else:
            self.releasing[request_id] = stats

    def _release_transferred(self) -> None:
        for request_id, stats in list(self.releasing.items()):
            if stats.released():
                del self.releasing[request_id]
                release(self.engine, request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        regular = [out for out in outputs if out.finish_reason != "prefilled"]
        for out in outputs:
            if out.finish_reason == "prefilled":
                self._hand_off(out)
        if regular:
            self.conn.send(m.Outputs(regular))

    def _hand_off(self, out: RequestOutput) -> None:
        stats, exposed = self.streamer.finish(out.request_id)
        handoff = replace(take_handoff(self.engine, out.request_id),
                          session=self.handoff_sessions.pop(out.request_id, None))
        self._release_when_read(out.request_id, stats)
        self.conn.send(m.Outputs([out]))
        self.conn.send(m.Prefilled(handoff, stats.bytes, stats.send_seconds, exposed))
