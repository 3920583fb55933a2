"""Sparse history masks applied inside attention, against transformers under the equivalent 4-D mask."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import Sequence
from engine.model.attention import span_mask
from engine.model.mask import MaskedSpan, block_keys
from engine.model.runner import _attended
from engine.workers.worker.kv_stream import wire_hashes

PROMPT_LEN = 40
STEPS = 6


def reference_mask(length: int, spans: list[MaskedSpan]) -> torch.Tensor:
    """Written out element by element, independently of the engine's vectorised mask."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for q in range(length):
        for k in range(q + 1):
            skipped = any(s.start <= k < s.end and s.skips_for(q) for s in spans)
            allowed[q, k] = k == q or not skipped
    return allowed


def hf_masked_logits(model: torch.nn.Module, tokens: list[int], spans: list[MaskedSpan]) -> torch.Tensor:
    allowed = reference_mask(len(tokens), spans)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))  # eager attention adds it
    with torch.inference_mode():
        return model(torch.tensor([tokens]), attention_mask=additive[None, None]).logits[0].float()


SHAPES = {
    "one old observation": [MaskedSpan(5, 20, 20)],
    "two spans, one from mid-prompt": [MaskedSpan(3, 9, 12), MaskedSpan(15, 30, 33)],
    "masked only while decoding": [MaskedSpan(10, 25, PROMPT_LEN + 2)],
    "span at the very start": [MaskedSpan(0, 8, 8)],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_masked_attention_matches_transformers(shape: str, make_hf_checkpoint: Callable[..., Path],
                                               load_hf_reference: Callable[[Path], torch.nn.Module]) -> None:
    checkpoint = make_hf_checkpoint("llama")
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), EngineSettings(block_size=8, num_kv_blocks=64, max_num_batched_tokens=16))
    prompt = [1, *torch.randint(3, 300, (PROMPT_LEN - 1,), generator=torch.Generator().manual_seed(2)).tolist()]
    spans = SHAPES[shape]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)
    for _ in range(2):  # the second run takes the prompt's blocks from the prefix cache
        request_id = engine.add_request(prompt, params, masked_spans=spans)
        logits, tokens = [], []
        while engine.has_unfinished():
            for out in engine.step():
                assert out.request_id == request_id
                logits += out.logits
                tokens += out.new_token_ids
        reference = hf_masked_logits(model, prompt + tokens[:-1], spans)[PROMPT_LEN - 1:]
        torch.testing.assert_close(torch.stack(logits), reference, atol=1e-4, rtol=0)
        unmasked = hf_masked_logits(model, prompt + tokens[:-1], [])[PROMPT_LEN - 1:]
        assert not torch.allclose(unmasked, reference, atol=1e-3), "the mask must change the result"


def test_blocks_computed_under_another_mask_are_not_reused(make_hf_checkpoint: Callable[..., Path],
                                                           load_hf_reference: Callable[[Path], torch.nn.Module]
                                                           ) -> None:
    checkpoint = make_hf_checkpoint("llama")
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), EngineSettings(block_size=8, num_kv_blocks=64))
    prompt = list(range(1, PROMPT_LEN + 1))
    params = SamplingParams(temperature=0, max_tokens=1, return_logits=True)
    spans = [MaskedSpan(2, 6, 6)]
    engine.generate([prompt], params)  # unmasked KV for the whole prompt is now cached
    request_id = engine.add_request(prompt, params, masked_spans=spans)
    outs = [out for _ in range(10) if engine.has_unfinished() for out in engine.step()]
    assert outs[-1].request_id == request_id and outs[-1].num_cached_tokens == 0  # block 0 differs
    reference = hf_masked_logits(model, prompt, spans)[-1]
    torch.testing.assert_close(outs[-1].logits[0], reference, atol=1e-4, rtol=0)


def test_invalid_spans_are_rejected() -> None:
    with pytest.raises(ValueError, match="invalid masked span"):
        MaskedSpan(5, 5, 5)
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=16))
    with pytest.raises(ValueError, match="ends past the prompt"):
        engine.add_request([1, 2, 3], SamplingParams(), masked_spans=[MaskedSpan(0, 9, 9)])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("num_computed", [0, 1, 17, PROMPT_LEN - 1])
def test_a_step_s_mask_is_the_reference_mask_s_rows_of_its_queries(shape: str, num_computed: int) -> None:
    """Every step (a prefill chunk or a decode token, after any cached prefix) gets the rows of its queries. The
    last span is masked from inside itself, so its own queries must still see themselves."""
    spans = [*SHAPES[shape], MaskedSpan(30, 38, 33)]
    reference = reference_mask(PROMPT_LEN + 4, spans)
    for query_len in (1, 3, PROMPT_LEN + 4 - num_computed):
        end = num_computed + query_len
        mask = span_mask(num_computed, query_len, [(s.start, s.end, s.from_position, s.until_position) for s in spans])
        assert torch.equal(mask, reference[num_computed:end, :end]), (num_computed, query_len)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("num_computed", [0, 1, 17, PROMPT_LEN - 1, PROMPT_LEN + 3])
def test_a_step_attends_only_to_what_some_query_of_it_sees(shape: str, num_computed: int) -> None:
    """Masks shrink attention: the columns every query of a step skips are left out of its context (a decode
    token's then needs no mask), and its mask is the reference's rows over the columns kept."""
    spans = [*SHAPES[shape], MaskedSpan(30, 38, 33)]
    reference = reference_mask(PROMPT_LEN + 4, spans)
    seq = Sequence("r", list(range(3, 3 + PROMPT_LEN + 4)), SamplingParams(), masked_spans=tuple(spans))
    slots = torch.arange(100, 100 + PROMPT_LEN + 4)  # position p's cache slot is 100 + p
    for query_len in {1, 3, PROMPT_LEN + 4 - num_computed}:
        end = min(num_computed + query_len, PROMPT_LEN + 4)
        context, mask, _ = _attended(seq, num_computed, end, slots[:end])
        rows = reference[num_computed:end, :end]
        seen = rows.any(dim=0)
        assert context.tolist() == (100 + torch.nonzero(seen).flatten()).tolist(), (num_computed, query_len)
        if end - num_computed == 1:
            assert mask is None
        else:
            assert mask is not None and torch.equal(mask, rows[:, seen])


def test_a_cache_salt_keys_the_first_block_and_so_changes_every_chained_hash() -> None:
    tokens = list(range(1, 50))
    plain, salted, other = (wire_hashes(tokens, 16, (), salt) for salt in (None, "key:alice", "key:bob"))
    assert block_keys((), 16) == () and wire_hashes(tokens, 16, ()) == plain  # no salt: the hashes of before
    keys = block_keys((), 16, "key:alice")
    assert callable(keys) and keys(0) == ("key:alice",) and keys(1) == ()
    assert all(len({a, b, c}) == 3 for a, b, c in zip(plain, salted, other, strict=True))
