"""`agentserve bench ipc`: every codec gives back the very messages it was given, and the report has a row
per message and codec with its bytes and times."""

from __future__ import annotations

import json
from pathlib import Path

from agents_eval.bench.ipc import msgspec_codec, outputs_message, pickle_codec, submit_message
from agentserve.cli import main


def test_both_codecs_rebuild_the_typed_messages() -> None:
    codec = msgspec_codec()
    assert codec is not None, "msgspec is a dev dependency"
    for encode, decode in (pickle_codec(), codec):
        for message in (outputs_message(3), submit_message(50)):
            assert decode(encode(message)) == message


def test_report_rows(tmp_path: Path) -> None:
    main(["bench", "ipc", "--out", str(tmp_path), "--repeat", "20"])
    rows = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert {(r["message"], r["codec"]) for r in rows} == {
        (message, codec) for message in ("Outputs x1", "Outputs x8", "Outputs x64", "Submit 128 tokens",
                                         "Submit 4096 tokens") for codec in ("pickle", "msgspec")}
    # medians of separate timings: under load a codec median can exceed a round trip's, so no order between them
    assert all(r["bytes"] > 0 and r["round_trip_us"] > 0 and r["codec_us"] > 0 for r in rows)
    assert (tmp_path / "ipc.png").stat().st_size > 0
