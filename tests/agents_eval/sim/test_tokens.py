"""The token view the simulator's sequences hand the scheduler reads as the list it stands for."""

from __future__ import annotations

from agents_eval.sim.tokens import SimSequence, TokenView
from engine.core.sampling.sampler import SamplingParams


def test_view_slices_like_the_concatenated_list() -> None:
    head, tail = list(range(10)), list(range(100, 104))
    view, whole = TokenView(head, tail), head + tail
    assert len(view) == len(whole) and list(view) == whole
    for start in range(-3, 15):
        for stop in (None, 0, 3, 10, 12, 14, 20, -1):
            assert view[start:stop] == whole[start:stop]
    assert view[::2] == whole[::2] and view[11] == whole[11] and view[-1] == whole[-1]


def test_sim_sequence_sees_its_outputs() -> None:
    seq = SimSequence("r", [1, 2, 3], SamplingParams(max_tokens=4))
    seq.output_token_ids.append(9)
    assert list(seq.all_token_ids) == [1, 2, 3, 9] and seq.all_token_ids[2:] == [3, 9]
