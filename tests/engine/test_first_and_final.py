"""Replies not streamed: only the first token's output and the last, which carries every delta between."""

from __future__ import annotations

from engine.output import FirstAndFinal, RequestOutput, merge_outputs
from engine.sampling import TokenLogprob


def out(tokens: list[int], text: str, finished: bool = False, cached: int = 0) -> RequestOutput:
    return RequestOutput("r", tokens, text, finished, "stop" if finished else None, 9, cached,
                         logprobs=[TokenLogprob(t, -1.0, []) for t in tokens])


def test_the_first_token_passes_then_the_rest_comes_merged_at_the_end() -> None:
    ends = FirstAndFinal()
    passed = [ends.pass_on(o) for o in (out([], "", cached=4), out([1], "a", cached=4), out([2], "b"),
                                        out([3, 4], "cd"), out([5], "e", finished=True))]
    first, final = passed[1], passed[4]
    assert passed[0] is None and passed[2] is None and passed[3] is None
    assert first is not None and first.new_token_ids == [1] and first.num_cached_tokens == 4
    assert final is not None and final.new_token_ids == [2, 3, 4, 5] and final.new_text == "bcde"
    assert [lp.token_id for lp in final.logprobs] == [2, 3, 4, 5] and final.finish_reason == "stop"
    assert len(ends) == 0  # nothing kept after the end


def test_a_reply_finished_at_its_first_token_passes_whole_and_forget_drops_what_is_held() -> None:
    ends = FirstAndFinal()
    single = ends.pass_on(out([7], "x", finished=True))
    assert single is not None and single.finished and len(ends) == 0
    ends.pass_on(out([1], "a"))
    ends.pass_on(out([2], "b"))
    assert len(ends) == 2
    ends.forget("r")
    assert len(ends) == 0


def test_merging_keeps_the_later_outputs_counts() -> None:
    merged = merge_outputs(out([1], "a", cached=2), out([2], "b", finished=True, cached=5))
    assert (merged.new_token_ids, merged.new_text, merged.num_cached_tokens, merged.finished) == ([1, 2], "ab", 5, True)
