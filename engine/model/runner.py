"""The only place that touches tensors: builds a step's inputs from a scheduled batch, runs the model
over the paged KV cache, and samples."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from engine.config import ModelConfig
from engine.core.sampling.grammar import Grammars
from engine.core.sampling.sampler import Sampler, TokenLogprob, token_logprob
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence
from engine.model.attention import (
    AttentionMetadata,
    ContextBlocks,
    DecodeBatch,
    QuerySpan,
    causal_mask,
    new_kv_cache,
    span_mask,
)
from engine.model.block_selection import BlockSummaries, ChunkSelection, QueryCapture, block_scores
from engine.model.llama import LlamaForCausalLM
from engine.model.mask import HistoryCounters, MaskedSpan, spans_skipping_blocks

KVAllocator = Callable[[list[tuple[tuple[int, ...], torch.dtype]]], list[torch.Tensor] | None]


@dataclass
class StepResult:
    sampled: dict[str, int]  # request id -> new token, for sequences whose chunk reached their end
    logits: dict[str, torch.Tensor]  # request id -> [vocab] logits, for those that asked for them
    logprobs: dict[str, TokenLogprob]  # for those that asked for them
    forced: dict[str, list[int]] = field(default_factory=dict)  # tokens a grammar forces after the sampled one


@dataclass
class _Entry:
    seq: Sequence
    num_new: int
    block_ids: list[int]


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # cuDNN's attention (bf16/fp16 only, first choice on Hopper) builds a graph for each new sequence length,
            # and a decode step's context grows by one each step: on an H200, 64 bf16 decode steps of one stream
            # at new lengths took 3.3 s, the same steps at lengths seen before 0.65 s for 8 streams, in float32
            # (no cuDNN) 0.37 s. Flash and memory-efficient attention take any length.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.batch_decodes = self.device.type != "cpu"  # see attention.DecodeBatch
        self._block_offsets = torch.arange(block_size)
        self.sampler = Sampler()
        self.summaries = BlockSummaries(block_size)  # of the `query` and `attention` policies' requests only
        self.history = HistoryCounters()
        self.grammars: Grammars | None = None  # set by the engine at its first constrained request
        self.kv_caches = [
            new_kv_cache(num_blocks * block_size, config.num_key_value_heads, config.head_dim, dtype, device)
            for _ in range(config.num_hidden_layers)
        ]

    def place_kv_caches(self, allocate: KVAllocator) -> bool:
        """Move the KV cache, contents kept, into tensors from `allocate` (None: it stays where it is), e.g. a
        transport's registered shared memory, from which a transfer's receiver copies straight; host only."""
        if self.device.type != "cpu":
            return False
        caches = allocate([(tuple(cache.shape), cache.dtype) for cache in self.kv_caches])
        if caches is None:
            return False
        for new, old in zip(caches, self.kv_caches, strict=True):
            new.copy_(old)
        self.kv_caches = caches
        return True

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, block_tables: list[list[int]],
                layer_done: Callable[[int], None] | None = None) -> StepResult:
        entries = [_Entry(s, n, b) for s, n, b in zip(batch.seqs, batch.num_new_tokens, block_tables, strict=True)]
        input_ids, positions, meta = self._prepare(entries)
        meta.layer_done = layer_done
        selecting = [(row, e) for row, e in zip(_first_rows(entries), entries, strict=True) if _selects(e)]
        if selecting:
            meta.query_capture = QueryCapture(torch.tensor([row for row, _ in selecting], device=self.device))
        chunks = [(e, span.chunk_selection) for e, span in zip(entries, meta.spans, strict=True)
                  if span.chunk_selection is not None]
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        for entry, chunk in chunks:
            self._chunk_picked(entry, chunk)
        if meta.query_capture is not None:
            self._select_blocks([e for _, e in selecting], meta.query_capture)
        ends = torch.tensor([e.num_new for e in entries]).cumsum(0) - 1
        sampling = [i for i, e in enumerate(entries) if e.seq.num_computed_tokens + e.num_new == e.seq.num_tokens]
        if not sampling:
            return StepResult({}, {}, {})
        logits = self.model.compute_logits(hidden[ends[sampling]])
        seqs = [entries[i].seq for i in sampling]
        request_ids = [s.request_id for s in seqs]
        if self.grammars is not None:
            self.grammars.apply(logits, request_ids)
        tokens = self.sampler.sample(logits, request_ids, [s.params for s in seqs])
        return StepResult(
            sampled={s.request_id: t for s, t in zip(seqs, tokens, strict=True)},
            logits={s.request_id: logits[row].to("cpu", copy=True)
                    for row, s in enumerate(seqs) if s.params.return_logits},
            logprobs={s.request_id: token_logprob(logits[row], token, s.params.logprobs)
                      for row, (s, token) in enumerate(zip(seqs, tokens, strict=True))
                      if s.params.logprobs is not None},
            forced=self._jump_forward(seqs, tokens),
        )

    def release(self, request_id: str) -> None:
        """A request left the engine: drop its block summaries and its grammar matcher."""
        self.summaries.forget(request_id)
        if self.grammars is not None:
            self.grammars.remove(request_id)

    def _chunk_picked(self, entry: _Entry, chunk: ChunkSelection) -> None:
        """Count a prefill chunk's picks; when the chunk ends the prompt, its scores make the first decode pick,
        so no decode step reads the whole history (the first decode step reads these, and picks for the next)."""
        seq, start = entry.seq, entry.seq.num_computed_tokens
        end = start + entry.num_new
        self.history.record(chunk.policy, chunk.history_blocks, len(chunk.picked[0]))
        self.summaries.record_chunk(seq.request_id, start, end, chunk)
        if end != seq.num_tokens or seq.output_token_ids or seq.selection is None:
            return
        full = end // self.block_size
        skipped = seq.selection.skipped_blocks(chunk.decode_scores(full), end, self.block_size)
        self.history.record(seq.selection.policy, full, full - len(skipped))
        seq.selected_spans = _reselected(seq.selected_spans, spans_skipping_blocks(skipped, self.block_size, end), end)

    def _select_blocks(self, entries: list[_Entry], capture: QueryCapture) -> None:
        """The `query` and `attention` policies: score each decoding request's full history blocks by this step's
        queries (their key bounds, or the attention they gave) and skip, from its next step on, those its
        selection leaves out."""
        scale = self.config.head_dim ** -0.5
        for index, entry in enumerate(entries):
            seq, position = entry.seq, entry.seq.num_computed_tokens
            assert seq.selection is not None
            full = entry.block_ids[:position // self.block_size]
            if seq.selection.policy == "attention":
                scores = self.summaries.attention(seq.request_id, capture.of_row(index), full, self.kv_caches, scale)
            else:
                scores = block_scores(capture.of_row(index), self.summaries.bounds(seq.request_id, full,
                                                                                   self.kv_caches), scale)
            skipped = seq.selection.skipped_blocks(scores.tolist(), position, self.block_size)
            self.history.record(seq.selection.policy, len(full), len(full) - len(skipped))
            new = spans_skipping_blocks(skipped, self.block_size, position + 1)
            seq.selected_spans = _reselected(seq.selected_spans, new, position + 1)

    def _jump_forward(self, seqs: list[Sequence], tokens: list[int]) -> dict[str, list[int]]:
        """Each constrained sequence's matcher advanced by its sampled token; the tokens its grammar then forces
        (none for a prefill worker's request, which ends at its first token)."""
        if self.grammars is None:
            return {}
        forced = {}
        for seq, token in zip(seqs, tokens, strict=True):
            room = 0 if seq.prefill_only else forced_room(seq, self.config.max_position_embeddings, 1)
            tokens_forced = self.grammars.accept(seq.request_id, token, room)
            if tokens_forced:
                forced[seq.request_id] = tokens_forced
        return forced

    def read_kv(self, layer: int, block_ids: list[int], num_tokens: int) -> torch.Tensor:
        """One layer's K and V of a request's first num_tokens tokens: [2, num_tokens, kv_heads, head_dim], in
        host memory (a copy off a GPU), since every reader sends it to another worker or a storage tier."""
        return self.kv_caches[layer].index_select(1, self._slots(block_ids, 0, num_tokens).to(self.device)).cpu()

    def write_kv(self, layer: int, block_ids: list[int], start: int, kv: torch.Tensor) -> None:
        """Store [2, tokens, kv_heads, head_dim] received from another worker (host memory) at positions start.."""
        cache = self.kv_caches[layer]
        slots = self._slots(block_ids, start, start + kv.shape[1]).to(self.device)
        cache.index_copy_(1, slots, kv.to(device=cache.device, dtype=cache.dtype))

    def _slots(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        """The cache slots of positions start..end."""
        first, last = start // self.block_size, -(-end // self.block_size)
        offset = first * self.block_size
        return self._block_slots(block_ids[first:last])[start - offset:end - offset]

    def _block_slots(self, block_ids: list[int]) -> torch.Tensor:
        """Every slot of these blocks, in order: block b's are b x block_size + 0..block_size."""
        table = torch.tensor(block_ids, dtype=torch.long).unsqueeze(1)
        return (table * self.block_size + self._block_offsets).view(-1)

    def _prepare(self, entries: list[_Entry]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        slot_mapping: list[torch.Tensor] = []
        spans: list[QuerySpan] = []
        for entry, context in zip(entries, self._contexts(entries), strict=True):
            start = entry.seq.num_computed_tokens
            end = start + entry.num_new
            ids.extend(entry.seq.token_ids(start, end))
            positions.append(torch.arange(start, end))
            slot_mapping.append(context[start:])
            slots, mask, visible = _attended(entry.seq, start, end, context)
            blocks = None if visible is None else self._whole_blocks(visible, entry.block_ids)
            chunk = None if entry.seq.selection is None or not _picks_in_step(entry.seq, start) else \
                self.summaries.chunk_selection(entry.seq.request_id, entry.seq.selection, start, end, entry.block_ids,
                                               self.kv_caches)
            if chunk is not None:  # each layer picks the history it reads (block_selection.ChunkSelection)
                slots, mask, blocks = context, span_mask(start, end - start, _spans(entry.seq)), None
            spans.append(QuerySpan(len(ids) - entry.num_new, entry.num_new, slots, mask, context_blocks=blocks,
                                   chunk_selection=chunk))
        meta = AttentionMetadata(torch.cat(slot_mapping), spans,
                                 decode_batch=DecodeBatch.of(spans) if self.batch_decodes else None)
        to = self.device
        if to.type != "cpu":
            meta = meta.to(to)
        return torch.tensor(ids, device=to), torch.cat(positions).to(to), meta

    def _whole_blocks(self, visible: torch.Tensor, block_ids: list[int]) -> ContextBlocks | None:
        """The visible context as whole blocks (the last one as far as it goes), or None when a block is
        partly visible."""
        size = self.block_size
        full = visible.numel() // size
        by_block = visible[:full * size].view(full, size)
        kept = by_block.all(dim=1)
        if not bool((kept | ~by_block.any(dim=1)).all()) or not bool(visible[full * size:].all()):
            return None
        table = torch.tensor(block_ids[:-(-visible.numel() // size)], dtype=torch.long)
        ids = torch.cat((table[:full][kept], table[full:]))
        return ContextBlocks(ids, size)

    def _contexts(self, entries: list[_Entry]) -> list[torch.Tensor]:
        """Each entry's context slots, positions 0 up to its step's end, from one tensor for the whole step (a
        decode step's streams cost a slice each, not a table of their own)."""
        used = [-(-(e.seq.num_computed_tokens + e.num_new) // self.block_size) for e in entries]
        slots = self._block_slots([b for e, n in zip(entries, used, strict=True) for b in e.block_ids[:n]])
        contexts, offset = [], 0
        for entry, blocks in zip(entries, used, strict=True):
            contexts.append(slots[offset:offset + entry.seq.num_computed_tokens + entry.num_new])
            offset += blocks * self.block_size
        return contexts


def _selects(entry: _Entry) -> bool:
    """Whether this step picks the request's history blocks: a decode step of a `query` request, when due."""
    seq = entry.seq
    return (seq.selection is not None and entry.num_new == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens
            and seq.selection.due(len(seq.output_token_ids)))


def _picks_in_step(seq: Sequence, start: int) -> bool:
    """Whether a step from `start` picks the history it reads layer by layer (`block_selection.ChunkSelection`): a
    prefill chunk, or the first decode step when the prompt's last chunk made it no picks (a prefill that read
    everything), so that no decode step reads the whole history."""
    return start < seq.num_prompt_tokens or (start == seq.num_prompt_tokens and not seq.selected_spans)


def forced_room(seq: Sequence, max_model_len: int, pending: int = 0) -> int:
    """How many forced tokens a sequence may still take after `pending` more, leaving one to sample."""
    output = len(seq.output_token_ids) + pending
    return min(seq.params.max_tokens - output, max_model_len - seq.num_tokens - pending) - 1


def _first_rows(entries: list[_Entry]) -> list[int]:
    """Each entry's first row in the flattened step."""
    rows, row = [], 0
    for entry in entries:
        rows.append(row)
        row += entry.num_new
    return rows


def _reselected(spans: tuple[MaskedSpan, ...], new: list[MaskedSpan], position: int) -> tuple[MaskedSpan, ...]:
    """The selection's spans once a new one takes over at this position: the open ones closed there (kept open
    when the new selection skips the same tokens), then the new ones."""
    open_spans = [span for span in spans if span.until_position is None]
    if [(s.start, s.end) for s in open_spans] == [(s.start, s.end) for s in new]:
        return spans
    closed = tuple(span if span.until_position is not None else replace(span, until_position=position)
                   for span in spans)
    return closed + tuple(new)


def _spans(seq: Sequence) -> list[tuple[int, int, int, int | None]]:
    return [(span.start, span.end, span.from_position, span.until_position) for span in seq.attention_spans]


def _attended(seq: Sequence, start: int, end: int, context: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The context slots the queries at positions start..end attend to, their mask (None: none needed, a
    fresh prefill's causal one aside), and which positions those are (None: all). A history mask shrinks
    attention rather than adding a mask to it: the tokens every query of the chunk skips (a span in force from
    the chunk's start to its end) are left out of its context, so a decode step's query attends to the rest
    unmasked and skipped blocks are never read."""
    spans = seq.attention_spans
    if not spans:
        return context, None if end - start == 1 else causal_mask(start, end - start), None
    visible = torch.ones(end, dtype=torch.bool)
    for span in spans:
        if span.skips_for(start) and span.skips_for(end - 1):  # a query always sees itself: only columns before
            visible[span.start:min(span.end, start)] = False  # the chunk go
    if bool(visible.all()):
        return context, None if end - start == 1 else span_mask(start, end - start, _spans(seq)), None
    if end - start == 1:
        return context[visible], None, visible
    return context[visible], span_mask(start, end - start, _spans(seq))[:, visible], visible
