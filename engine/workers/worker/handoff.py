"""Moving a request from a prefill worker to a decode worker: what travels besides the KV bytes, and
how each side gives and takes it. The prefill side samples the first token; the decode side continues
with the same generator state, so sampled outputs are the same wherever they are produced."""

from __future__ import annotations

import io

import torch

from engine.core.llm_engine import LLMEngine
from engine.core.sequence import Sequence
from engine.kv_cache.wire import KVBlock
from engine.workers.messages import Handoff


def take_handoff(engine: LLMEngine, request_id: str) -> Handoff:
    """The prefill side's record of a request that ended "prefilled" (its KV stays until released)."""
    prefilled = engine.prefilled[request_id]
    seq = prefilled.seq
    return Handoff(request_id, seq.prompt_token_ids, list(seq.output_token_ids), seq.params,
                   _tensor_bytes(prefilled.sampler_state), seq.num_cached_tokens or 0, seq.masked_spans,
                   selection=seq.selection, selected_spans=seq.selected_spans)


def read_layer(engine: LLMEngine, request_id: str, layer: int, num_tokens: int) -> torch.Tensor:
    """[2, num_tokens, kv_heads, head_dim] of a prefilled (or running) request."""
    prefilled = engine.prefilled.get(request_id)
    block_ids = ([b.block_id for b in prefilled.blocks.blocks] if prefilled else engine.kv.block_ids(request_id))
    return engine.runner.read_kv(layer, block_ids, num_tokens)


def release(engine: LLMEngine, request_id: str) -> None:
    prefilled = engine.prefilled.pop(request_id, None)
    if prefilled is not None:
        engine.kv.release(prefilled.blocks)


def accept_handoff(engine: LLMEngine, handoff: Handoff, kv_frames: list[list[KVBlock]] | None) -> bool:
    """Continue a prefilled request here. With its KV (per layer, frames covering its tokens in order, each
    copied once into this engine's blocks, straight from the sender's memory when it came by reference)
    decoding starts at once;
    without it, or without room for it, the KV is recomputed from the token ids. Returns whether the
    received KV was used."""
    seq = Sequence(handoff.request_id, list(handoff.prompt_token_ids), handoff.params,
                   output_token_ids=list(handoff.output_token_ids), num_cached_tokens=handoff.num_cached_tokens,
                   masked_spans=handoff.masked_spans, session=handoff.session, selection=handoff.selection,
                   selected_spans=handoff.selected_spans)
    state = _bytes_tensor(handoff.sampler_state)
    used = kv_frames is not None and _load_kv(engine, seq, kv_frames)
    engine.outputs.resume(seq)
    engine.admit(seq, state, running=used)
    return used


def _load_kv(engine: LLMEngine, seq: Sequence, kv_frames: list[list[KVBlock]]) -> bool:
    num_tokens = seq.num_prompt_tokens
    if engine.kv.allocate_slots(seq.request_id, seq.all_token_ids, 0, num_tokens) is None:
        return False
    block_ids = engine.kv.block_ids(seq.request_id)
    for layer, frames in enumerate(kv_frames):
        for frame in frames:
            engine.runner.write_kv(layer, block_ids, frame.token_start, frame.tensor)
    seq.num_computed_tokens = num_tokens
    return True


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _bytes_tensor(data: bytes) -> torch.Tensor:
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    assert isinstance(loaded, torch.Tensor)
    return loaded
