"""Property tests of the session (de)serializer, what the gateway's store keeps between turns: any state
round-trips exactly; any other bytes, or JSON of another shape, raise ValueError and nothing else."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.model.mask import MaskedSpan
from trajectory.session import SessionState, ToolGap, TurnRecord
from trajectory.template.incremental import RenderedTurn
from trajectory.template.types import ROLES, Message

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(max_size=12)
FLOAT = st.floats(allow_nan=False, allow_infinity=False)
POSITION = st.integers(0, 2**31)
SCALARS = st.none() | st.booleans() | st.integers() | FLOAT | TEXT
JSON = st.recursive(SCALARS, lambda children: st.lists(children, max_size=3)
                    | st.dictionaries(TEXT, children, max_size=3), max_leaves=12)
TOOL_CALLS = st.none() | st.lists(st.fixed_dictionaries({"id": TEXT, "type": st.just("function"), "function":
                                                         st.fixed_dictionaries({"name": TEXT, "arguments": TEXT})}),
                                  min_size=1, max_size=2)
MESSAGES = st.builds(Message, st.sampled_from(ROLES), TEXT, TOOL_CALLS, st.none() | TEXT, st.none() | TEXT)


@st.composite
def masked_spans(draw: st.DrawFn) -> MaskedSpan:
    start = draw(POSITION)
    end = draw(st.integers(start + 1, start + 2**20))
    return MaskedSpan(start, end, draw(st.integers(start, start + 2**21)))


@st.composite
def turn_records(draw: st.DrawFn) -> TurnRecord:
    start = draw(POSITION)
    return TurnRecord(draw(st.sampled_from(ROLES)), start, draw(st.integers(start, start + 4096)),
                      draw(st.none() | TEXT), draw(st.booleans()), draw(st.none() | POSITION),
                      draw(st.none() | st.sampled_from(["think", "act"])), draw(st.none() | FLOAT), draw(FLOAT))


STATES = st.builds(
    SessionState, session_id=TEXT,
    rendered=st.lists(st.builds(RenderedTurn, MESSAGES, TEXT, st.lists(POSITION, max_size=8).map(tuple)), max_size=4),
    turns=st.lists(turn_records(), max_size=4), masked_spans=st.lists(masked_spans(), max_size=3),
    tool_gaps=st.dictionaries(TEXT, st.builds(ToolGap, FLOAT, st.integers(0, 1000)), max_size=3),
    pending_tools=st.lists(TEXT, max_size=3), reply_finished_at=st.none() | FLOAT,
    announced_tool=st.none() | st.tuples(TEXT, FLOAT, st.none() | FLOAT), prefix_stable=st.booleans(),
    client_digests=st.lists(TEXT, max_size=4))


def compressed(payload: Any) -> bytes:
    return zlib.compress(json.dumps(payload).encode())


def restore_or_refuse(data: bytes) -> SessionState | None:
    """The restored state, which must itself round-trip; None when refused with ValueError."""
    try:
        state = SessionState.from_bytes(data)
    except ValueError:
        return None
    assert SessionState.from_bytes(state.to_bytes()) == state
    return state


@FUZZ
@given(state=STATES)
def test_every_state_round_trips_exactly(state: SessionState) -> None:
    assert SessionState.from_bytes(state.to_bytes()) == state


@FUZZ
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes_are_refused_with_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        SessionState.from_bytes(data)


@FUZZ
@given(state=STATES, data=st.data())
def test_a_cut_or_changed_record_is_refused_or_still_a_session(state: SessionState, data: st.DataObject) -> None:
    record = bytearray(state.to_bytes())
    at = data.draw(st.integers(0, len(record) - 1), label="at")
    if data.draw(st.booleans(), label="cut"):
        assert restore_or_refuse(bytes(record[:at])) is None
    else:
        record[at] ^= data.draw(st.integers(1, 255), label="xor")
        restore_or_refuse(bytes(record))  # zlib's checksum catches most changes; what passes must be whole


@FUZZ
@given(payload=JSON)
def test_compressed_json_of_another_shape_is_refused(payload: Any) -> None:
    assert restore_or_refuse(compressed(payload)) is None  # no version 1 session among random JSON


def replace_somewhere(payload: Any, data: st.DataObject) -> None:
    """Walk down from the top to a random container and replace (or drop) one of its values with any JSON."""
    node = payload
    while True:
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return
        key = data.draw(st.sampled_from(keys), label="key")
        if isinstance(node[key], dict | list) and node[key] and data.draw(st.booleans(), label="deeper"):
            node = node[key]
            continue
        if isinstance(node, dict) and data.draw(st.booleans(), label="drop"):
            del node[key]
        else:
            node[key] = data.draw(JSON, label="value")
        return


@FUZZ
@given(state=STATES, data=st.data())
def test_any_value_of_a_record_replaced_is_refused_or_still_a_session(state: SessionState,
                                                                       data: st.DataObject) -> None:
    payload = json.loads(zlib.decompress(state.to_bytes()))
    replace_somewhere(payload, data)
    restore_or_refuse(compressed(payload))
