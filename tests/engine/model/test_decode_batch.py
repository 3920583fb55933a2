"""Decode spans attended together (attention.DecodeBatch, the GPU's path) against each span attended alone, and
the whole engine with them batched on the CPU against transformers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model import attention
from engine.model.attention import AttentionMetadata, DecodeBatch, QuerySpan, paged_attention, span_mask
from tests.engine.model.test_engine_parity import STEPS, check_against_hf, prompts

HEADS, KV_HEADS, HEAD_DIM, SLOTS = 8, 2, 16, 256


def step_of(contexts: list[list[int]], prefill: int = 0,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """q, k, v and metadata of a step: one decode token per context (its slots, the new token's last), the second
    one's third to sixth slots masked, and, with `prefill`, a fresh prompt chunk of that many tokens first."""
    generator = torch.Generator().manual_seed(0)
    spans, slot_mapping = [], []
    if prefill:
        slots = torch.arange(200, 200 + prefill)
        spans.append(QuerySpan(0, prefill, slots, None))
        slot_mapping.append(slots)
    for index, context in enumerate(contexts):
        slots = torch.tensor(context)
        mask = span_mask(len(context) - 1, 1, [(2, 6, 0, None)]) if index == 1 else None
        spans.append(QuerySpan(prefill + index, 1, slots, mask))
        slot_mapping.append(slots[-1:])
    tokens = prefill + len(contexts)
    q, k, v = (torch.randn(tokens, heads, HEAD_DIM, generator=generator) for heads in (HEADS, KV_HEADS, KV_HEADS))
    return q, k, v, AttentionMetadata(torch.cat(slot_mapping), spans)


CONTEXTS = [[3, 4, 5, 6, 7], [40, 41, 9, 10, 11, 12, 90, 91, 92], [100], [17, 16, 15, 14]]


@pytest.mark.parametrize("prefill", [0, 5], ids=["decodes only", "beside a prefill chunk"])
def test_batched_decode_spans_attend_as_each_alone(prefill: int) -> None:
    q, k, v, meta = step_of(CONTEXTS, prefill)
    cache = torch.randn(2, SLOTS, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    alone = paged_attention(q, k, v, cache.clone(), meta, HEAD_DIM**-0.5)
    batch = DecodeBatch.of(meta.spans)
    assert batch is not None and batch.slots.shape == (len(CONTEXTS), 9) and batch.rows.tolist() == [
        prefill + i for i in range(len(CONTEXTS))]
    assert batch.mask[1, 0, 0].tolist() == [True, True, False, False, False, False, True, True, True]
    together = paged_attention(q, k, v, cache.clone(), AttentionMetadata(meta.slot_mapping, meta.spans,
                                                                         decode_batch=batch), HEAD_DIM**-0.5)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


def test_no_batch_for_a_lone_decode_or_past_the_slot_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DecodeBatch.of(step_of(CONTEXTS[:1], prefill=5)[3].spans) is None
    monkeypatch.setattr(attention, "MAX_BATCHED_DECODE_SLOTS", 4 * 9 - 1)
    assert DecodeBatch.of(step_of(CONTEXTS)[3].spans) is None


def test_the_engine_with_batched_decodes_matches_transformers(
        make_hf_checkpoint: Callable[..., Path], load_hf_reference: Callable[[Path], torch.nn.Module]) -> None:
    checkpoint = make_hf_checkpoint("llama")
    model = load_hf_reference(checkpoint)
    engine = LLMEngine(str(checkpoint), EngineSettings(block_size=8, num_kv_blocks=256, max_num_batched_tokens=48))
    assert not engine.runner.batch_decodes  # on the CPU spans attend one by one, read in place
    engine.runner.batch_decodes = True
    batch = prompts(model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)
    check_against_hf(engine.generate(batch, params), batch, model)


def test_a_span_on_a_device_works_out_its_first_slot_from_the_host_copy() -> None:
    """On a GPU reading the slots off the device would wait for it once per span per step; "meta" holds no values,
    so reading them there would raise."""
    consecutive, scattered = (QuerySpan(0, 1, torch.tensor(slots), None).to(torch.device("meta"))
                              for slots in ([8, 9, 10, 11], [8, 9, 30]))
    assert (consecutive.first_slot, scattered.first_slot) == (8, None)
    assert consecutive.context_slots.device.type == "meta" and consecutive.to(torch.device("meta")).first_slot == 8
