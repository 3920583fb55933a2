"""`agentserve bench ipc`: the encoding of the messages between the serving process and its engine workers,
chosen by measurement. The typed message dataclasses (`engine/workers/messages.py`) as they travel today
(pickle, protocol 5) against msgspec's MessagePack (encoded from the same dataclasses, decoded and rebuilt
into them, since a message must arrive typed). Per message kind and size: bytes on the wire, encode+decode
time, and a round trip over a real pipe to an echoing process (the pipe's own cost included). Writes
`report.json`, `report.md` and `ipc.png`."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agents_eval.harness.report import BarChart, Table, machine_info, write_report
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams
from engine.workers import messages as m

Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]


def outputs_message(streams: int) -> m.Outputs:
    """One step's outputs of `streams` decoding requests: a token and its text each."""
    return m.Outputs([RequestOutput(f"req-{i:032x}", [1000 + i], " word", False, None, 2048, 1024)
                      for i in range(streams)])


def submit_message(prompt_tokens: int) -> m.Submit:
    return m.Submit("req-" + "0" * 32, list(range(prompt_tokens)), SamplingParams(max_tokens=256, temperature=0.7))


def pickle_codec() -> Codec:
    return (lambda message: pickle.dumps(message, protocol=5)), pickle.loads


def msgspec_codec() -> Codec | None:
    try:
        import msgspec
    except ImportError:
        return None
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()

    def encode(message: Any) -> bytes:
        return encoder.encode((type(message).__name__, message))

    def decode(data: bytes) -> Any:
        kind, fields = decoder.decode(data)
        if kind == "Outputs":
            return m.Outputs([RequestOutput(**out) for out in fields["outputs"]])
        return m.Submit(**{**fields, "params": SamplingParams(**fields["params"]),
                           "masked_spans": tuple(fields["masked_spans"])})

    return encode, decode


def _echo(conn: Connection) -> None:
    while (data := conn.recv_bytes()) != b"":
        conn.send_bytes(data)


def _per_call_us(call: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(samples)


@dataclass
class Row:
    message: str
    codec: str
    bytes: int
    codec_us: float  # encode + decode, median
    round_trip_us: float  # encode, pipe to an echo and back, decode, median


def measure(codecs: dict[str, Codec], repeat: int) -> list[Row]:
    messages: dict[str, m.Outputs | m.Submit] = {f"Outputs x{n}": outputs_message(n) for n in (1, 8, 64)}
    messages |= {f"Submit {n} tokens": submit_message(n) for n in (128, 4096)}
    ours, theirs = mp.get_context("spawn").Pipe()
    echo = mp.get_context("spawn").Process(target=_echo, args=(theirs,), daemon=True)
    echo.start()
    rows = []
    try:
        for label, message in messages.items():
            for name, (encode, decode) in codecs.items():
                assert decode(encode(message)) == message, f"{name} changes {label}"

                def round_trip(encode: Callable[[Any], bytes] = encode, decode: Callable[[bytes], Any] = decode,
                               message: Any = message) -> None:
                    ours.send_bytes(encode(message))
                    decode(ours.recv_bytes())

                def codec_only(encode: Callable[[Any], bytes] = encode, decode: Callable[[bytes], Any] = decode,
                               message: Any = message) -> None:
                    decode(encode(message))

                rows.append(Row(label, name, len(encode(message)), _per_call_us(codec_only, repeat),
                                _per_call_us(round_trip, repeat)))
    finally:
        ours.send_bytes(b"")
        echo.join(5)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--repeat", type=int, default=2000, help="timed calls per message and codec")


def run(args: argparse.Namespace) -> None:
    codecs = {"pickle": pickle_codec()}
    if (packed := msgspec_codec()) is not None:
        codecs["msgspec"] = packed
    rows = measure(codecs, args.repeat)
    table = Table("Per message, medians", ["message", "codec", "bytes", "encode+decode (µs)", "pipe round trip (µs)"],
                  [[r.message, r.codec, str(r.bytes), f"{r.codec_us:.1f}", f"{r.round_trip_us:.1f}"] for r in rows])
    chart = BarChart("ipc.png", "Pipe round trip per message (median)", "µs",
                     [f"{r.message}\n{r.codec}" for r in rows], [r.round_trip_us for r in rows])
    notes = [] if "msgspec" in codecs else ["msgspec is not installed: pickle only"]
    data = {"rows": [asdict(r) for r in rows], "machine": machine_info(), "notes": notes,
            "goals": []}  # a measurement behind a design choice (docs/deployment.md); no goal is stated for it
    files = write_report(args.out, data,
                         "Engine messages: pickle against msgspec", [table], chart, notes)
    print(files.markdown.read_text())
