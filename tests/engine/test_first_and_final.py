"""Replies not streamed (`SamplingParams.every_token` off): the engine makes only the first token's output and the
last, which carries every delta since, logits and logprobs included."""

from __future__ import annotations

from engine.config import EngineSettings
from engine.llm_engine import LLMEngine
from engine.output import RequestOutput
from engine.sampling import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2, return_logits=True)


def outputs_of(every_token: bool, stop: list[str] | None = None) -> list[RequestOutput]:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=64))
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


def test_a_stop_string_ends_the_held_reply_where_it_ends_the_streamed_one() -> None:
    text = "".join(out.new_text for out in outputs_of(True))
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if not stop.strip():
        stop = text[-2:]
    every, ends = outputs_of(True, [stop]), outputs_of(False, [stop])
    assert "".join(out.new_text for out in ends) == "".join(out.new_text for out in every)
    assert ends[-1].finish_reason == every[-1].finish_reason
