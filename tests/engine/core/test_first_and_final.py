"""Replies not streamed (`SamplingParams.every_token` off): the engine makes only the first token's output and the
last, which carries every delta since, logits and logprobs included. Streamed replies under a `stream_interval`:
the first token's output, then one every `stream_interval` tokens, then the last."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2, return_logits=True)


def outputs_of(every_token: bool, stop: list[str] | None = None, stream_interval: int = 1) -> list[RequestOutput]:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=64, stream_interval=stream_interval))
    params = SamplingParams(**{**PARAMS.__dict__, "every_token": every_token, "stop": stop or []})
    engine.add_request("the tool printed three lines", params)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    return outputs


def test_two_outputs_carry_what_every_token_carries() -> None:
    every, ends = outputs_of(True), outputs_of(False)
    assert len(every) == 9 and [len(out.new_token_ids) for out in ends] == [1, 8]
    for field in ("new_token_ids", "logprobs"):
        assert [x for out in ends for x in getattr(out, field)] == [x for out in every for x in getattr(out, field)]
    assert sum(len(out.logits) for out in ends) == 9
    assert "".join(out.new_text for out in ends) == "".join(out.new_text for out in every)
    assert [out.finished for out in ends] == [False, True] and ends[-1].finish_reason == "length"


@pytest.mark.parametrize(("every_token", "interval"), [(False, 1), (True, 3)])
def test_a_stop_string_ends_the_held_reply_where_it_ends_the_streamed_one(every_token: bool, interval: int) -> None:
    text = "".join(out.new_text for out in outputs_of(True))
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if not stop.strip():
        stop = text[-2:]
    every, held = outputs_of(True, [stop]), outputs_of(every_token, [stop], stream_interval=interval)
    assert "".join(out.new_text for out in held) == "".join(out.new_text for out in every)
    assert held[-1].finish_reason == every[-1].finish_reason


@pytest.mark.parametrize(("interval", "sizes"), [(1, [1] * 9), (3, [1, 3, 3, 2]), (4, [1, 4, 4]), (20, [1, 8])])
def test_a_stream_interval_sends_every_nth_token_and_the_end(interval: int, sizes: list[int]) -> None:
    every, chunked = outputs_of(True), outputs_of(True, stream_interval=interval)
    assert [len(out.new_token_ids) for out in chunked] == sizes
    for field in ("new_token_ids", "logprobs"):
        assert [x for out in chunked for x in getattr(out, field)] == [x for out in every for x in getattr(out, field)]
    assert sum(len(out.logits) for out in chunked) == 9
    assert "".join(out.new_text for out in chunked) == "".join(out.new_text for out in every)
    assert [out.finished for out in chunked] == [False] * (len(sizes) - 1) + [True]


@pytest.mark.parametrize("interval", [0, -2])
def test_a_stream_interval_below_one_is_refused(interval: int) -> None:
    with pytest.raises(ValidationError, match="stream_interval"):
        EngineSettings(stream_interval=interval)
