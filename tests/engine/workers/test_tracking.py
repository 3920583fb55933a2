"""The coordinator's view of a request's outputs (`engine.workers.coordinator.tracking.Tracked.relay`)."""

from __future__ import annotations

import dataclasses

import torch

from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams, TokenLogprob
from engine.workers.coordinator.tracking import Tracked


def _raw(finished: bool = True, finish_reason: str = "stop") -> RequestOutput:
    return RequestOutput(request_id="req-1#retry1", new_token_ids=[5, 6, 7], new_text="abc", finished=finished,
                         finish_reason=finish_reason, num_prompt_tokens=11, num_cached_tokens=4,
                         logits=[torch.ones(3)], logprobs=[TokenLogprob(5, -0.5, ())])


def test_relay_keeps_every_field_it_does_not_rewrite() -> None:
    tracked = Tracked("req-1", [1, 2, 3], SamplingParams(max_tokens=4), ())
    raw = _raw()
    out = tracked.relay(raw)
    rewritten = {"request_id": "req-1", "new_token_ids": [5, 6, 7], "new_text": "abc", "finished": True,
                 "finish_reason": "stop"}
    for field in dataclasses.fields(RequestOutput):
        expected = rewritten.get(field.name, getattr(raw, field.name))
        assert getattr(out, field.name) is expected or getattr(out, field.name) == expected, field.name


def test_relay_skips_what_a_rerun_regenerates_and_hides_the_prefill_handoff() -> None:
    tracked = Tracked("req-1", [1, 2, 3], SamplingParams(max_tokens=4), ())
    tracked.skip, tracked.skip_chars = 2, 2
    out = tracked.relay(_raw(finished=True, finish_reason="prefilled"))
    assert (out.new_token_ids, out.new_text, out.finished, out.finish_reason) == ([7], "c", False, None)
    assert tracked.output_ids == [7] and tracked.skip == 0
