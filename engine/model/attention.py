"""Paged attention in plain torch.

KV cache of one layer: a tensor `[2, num_slots, num_kv_heads, head_dim]` (0 = keys, 1 = values), where
slot = block_id * block_size + offset. A step's tokens are flattened, one span per sequence (a prefill
chunk, or the single token of a decode). Each layer writes the step's new K/V into their slots, then each
span attends over the slots of its sequence's whole context (cached prefix + new tokens): read in place
when those slots are consecutive (a sequence whose blocks follow each other), gathered without padding
otherwise. A span whose history is sparse (blocks skipped by masks or by the `query` selection) attends to the
slots it keeps only, gathered block by block when it keeps whole blocks: a skipped block is neither read nor
multiplied.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F

from engine.model.block_selection import ChunkSelection, QueryCapture


@dataclass
class ContextBlocks:
    """A sparse context made of whole cache blocks, the last one possibly cut short: gathered block by block
    (a block's K or V is one run of memory), several times faster than slot by slot."""

    block_ids: torch.Tensor  # [n] long
    block_size: int

    def gather(self, kv_cache: torch.Tensor, context_len: int) -> torch.Tensor:
        """[2, context_len, KV, D]: the blocks' K and V, in order."""
        kv_heads, head_dim = kv_cache.shape[2:]
        blocks = kv_cache.view(2, -1, self.block_size * kv_heads * head_dim).index_select(1, self.block_ids)
        return blocks.view(2, -1, kv_heads, head_dim)[:, :context_len]

    def to(self, device: torch.device) -> ContextBlocks:
        return ContextBlocks(self.block_ids.to(device), self.block_size)


@dataclass
class QuerySpan:
    """One sequence's new tokens in this step: a prefill chunk, or one decode token."""

    query_start: int  # index of the chunk's first token in the flattened step
    query_len: int
    context_slots: torch.Tensor  # [context_len] long: slots of the whole context, new tokens last
    attn_mask: torch.Tensor | None  # [query_len, context_len] bool, True = attend; None: plain causal
    host_slots: torch.Tensor | None = None  # context_slots in host memory, when those are on a device
    context_blocks: ContextBlocks | None = None  # the same context as whole blocks, when history was skipped
    chunk_selection: ChunkSelection | None = None  # a prefill chunk whose layers each pick the history they read
    _tiled_masks: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def context_len(self) -> int:
        return int(self.context_slots.numel())

    @property
    def is_decode(self) -> bool:
        """One query token: what a `DecodeBatch` takes (a decode step, or a one-token prefill chunk, alike here)."""
        return self.query_len == 1

    def tiled_mask(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        """[group x query_len, context_len]: the mask once per query head of a group, as the additive mask
        attention turns a boolean one into; built once per step, not once per layer."""
        assert self.attn_mask is not None
        tiled = self._tiled_masks.get((group, dtype))
        if tiled is None:
            allowed = self.attn_mask.repeat(group, 1)
            tiled = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, -torch.inf)
            self._tiled_masks[(group, dtype)] = tiled
        return tiled

    @cached_property
    def first_slot(self) -> int | None:
        """The context's first slot when its slots are consecutive, so every layer reads its K/V in place;
        None when they are not. Worked out once per step, not once per layer, from the host's copy of the slots,
        so a GPU step does not wait on the device for it."""
        slots = self.context_slots if self.host_slots is None else self.host_slots
        if slots.numel() > 1 and not bool((slots.diff() == 1).all()):
            return None
        return int(slots[0])

    def to(self, device: torch.device) -> QuerySpan:
        mask = None if self.attn_mask is None else self.attn_mask.to(device)
        host = self.context_slots if self.context_slots.device.type == "cpu" else self.host_slots
        blocks = None if self.context_blocks is None else self.context_blocks.to(device)
        chunk = None if self.chunk_selection is None else self.chunk_selection.to(device)
        return QuerySpan(self.query_start, self.query_len, self.context_slots.to(device), mask, host, blocks,
                         chunk_selection=chunk)

    def narrowed(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float) -> QuerySpan:
        """This span as this layer's chunk selection leaves it: the picked history blocks and the chunk, whole
        blocks gathered in order, the mask's columns of those tokens."""
        assert self.chunk_selection is not None and self.attn_mask is not None
        chunk = self.chunk_selection
        size, history = chunk.block_size, chunk.history_blocks
        attended = chunk.attended_blocks(q, kv_cache, scale)
        tail = torch.arange(history, chunk.block_table.numel(), device=attended.device)
        blocks = torch.cat((attended, tail))
        columns = (blocks.unsqueeze(1) * size + torch.arange(size, device=blocks.device)).view(-1)
        columns = columns[columns < self.context_len]
        return QuerySpan(self.query_start, self.query_len, self.context_slots[columns], self.attn_mask[:, columns],
                         context_blocks=ContextBlocks(chunk.block_table[blocks], size))


MAX_BATCHED_DECODE_SLOTS = 1 << 20  # decode streams x their longest context, beyond which each attends alone


@dataclass
class DecodeBatch:
    """A step's decode spans (one query token each) attended in one call: their context slots padded to the longest,
    padding masked out. On a GPU a call per span costs more in launches than the padded gather; on the CPU a span
    whose slots are consecutive is read in place, so spans attend one by one there."""

    rows: torch.Tensor  # [B] long: the decode tokens' rows in the flattened step
    slots: torch.Tensor  # [B, L] long: each span's context slots, padded with slot 0
    mask: torch.Tensor  # [B, 1, 1, L] bool, True = attend

    @classmethod
    def of(cls, spans: list[QuerySpan]) -> DecodeBatch | None:
        """The decode spans of a step (host tensors), or None when fewer than two or too many padded slots."""
        decodes = [span for span in spans if span.is_decode and span.chunk_selection is None]
        longest = max((span.context_len for span in decodes), default=0)
        if len(decodes) < 2 or len(decodes) * longest > MAX_BATCHED_DECODE_SLOTS:
            return None
        slots = torch.zeros(len(decodes), longest, dtype=torch.long)
        mask = torch.zeros(len(decodes), longest, dtype=torch.bool)
        for row, span in enumerate(decodes):
            slots[row, :span.context_len] = span.context_slots
            mask[row, :span.context_len] = True if span.attn_mask is None else span.attn_mask[0]
        rows = torch.tensor([span.query_start for span in decodes], dtype=torch.long)
        return cls(rows, slots, mask.view(len(decodes), 1, 1, longest))

    def to(self, device: torch.device) -> DecodeBatch:
        return DecodeBatch(self.rows.to(device), self.slots.to(device), self.mask.to(device))


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] long: where each new token's K/V goes
    spans: list[QuerySpan]
    layer_done: Callable[[int], None] | None = None  # called after each layer (layer-wise KV streaming)
    decode_batch: DecodeBatch | None = None  # the decode spans, attended together (ModelRunner.batch_decodes)
    query_capture: QueryCapture | None = None  # rows whose queries score the history blocks (`query` policy)

    def to(self, device: torch.device) -> AttentionMetadata:
        batch = None if self.decode_batch is None else self.decode_batch.to(device)
        capture = None if self.query_capture is None else QueryCapture(self.query_capture.rows.to(device))
        return AttentionMetadata(self.slot_mapping.to(device), [p.to(device) for p in self.spans], self.layer_done,
                                 batch, capture)


def causal_mask(num_computed: int, query_len: int) -> torch.Tensor | None:
    """Query i (absolute position num_computed + i) sees context positions 0..num_computed + i.
    None when nothing is cached: attention then runs its fused causal path."""
    return None if num_computed == 0 else span_mask(num_computed, query_len, [])


def span_mask(num_computed: int, query_len: int, spans: list[tuple[int, int, int, int | None]]) -> torch.Tensor:
    """Causal mask [query_len, num_computed + query_len] for the queries at positions num_computed.. that also
    skips each (start, end, from_position, until_position) span for queries in [from_position, until_position)
    (until None: to the end). A query always sees itself, so no row is empty. Built by slices, a few small ops
    per span: a decode step builds one per masked stream."""
    allowed = torch.ones(query_len, num_computed + query_len, dtype=torch.bool).tril_(num_computed)
    for start, end, from_position, until_position in spans:
        last = query_len if until_position is None else max(0, until_position - num_computed)
        allowed[max(0, from_position - num_computed):last, start:end] = False
    rows = torch.arange(query_len)
    allowed[rows, rows + num_computed] = True
    return allowed


def new_kv_cache(num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Zeroed (a slot no step wrote must not hold a NaN that masked attention multiplies by 0). On the host in
    an anonymous memory mapping, whose pages the kernel zeroes on first touch: a cache sized from the RAM
    (engine/kv_cache/sizing.py) then takes memory as its blocks fill, not all at start (4 GiB: 12 s of
    zeroing on a busy 2-core host)."""
    shape = (2, num_slots, num_kv_heads, head_dim)
    if torch.device(device).type != "cpu" or not num_slots:
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KV, D]. Returns [T, H, D]."""
    kv_cache[0].index_copy_(0, meta.slot_mapping, k)
    kv_cache[1].index_copy_(0, meta.slot_mapping, v)
    if len(meta.spans) == 1:  # one sequence (a lone decode stream): its span is the whole step
        return _attend_span(q, kv_cache, meta.spans[0], scale)
    out = torch.empty_like(q)
    batch = meta.decode_batch
    if batch is not None:
        out[batch.rows] = _attend_decodes(q[batch.rows], kv_cache, batch, scale)
    for span in meta.spans:
        if batch is not None and span.is_decode and span.chunk_selection is None:  # attended in the batch above
            continue
        end = span.query_start + span.query_len
        out[span.query_start:end] = _attend_span(q[span.query_start:end], kv_cache, span, scale)
    return out


def _attend_decodes(q: torch.Tensor, kv_cache: torch.Tensor, batch: DecodeBatch, scale: float) -> torch.Tensor:
    """q: [B, H, D], one token per decode span -> [B, H, D]; each span's query heads grouped by KV head."""
    keys, values = kv_cache[:, batch.slots].permute(0, 1, 3, 2, 4)  # [B, KV, L, D] each
    num_spans, num_heads, head_dim = q.shape
    grouped = q.view(num_spans, keys.shape[1], num_heads // keys.shape[1], head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=batch.mask, scale=scale)
    return out.reshape(num_spans, num_heads, head_dim)


def _attend_span(q: torch.Tensor, kv_cache: torch.Tensor, span: QuerySpan, scale: float) -> torch.Tensor:
    """q: [query_len, H, D] -> [query_len, H, D]. torch's own GQA path (enable_gqa) gives up the fused CPU
    kernels, so heads are grouped by hand: a lone query's group becomes its query rows (no copy), and a
    chunk's K/V are repeated per query head. Inputs are 4-D (batch 1): with 3-D ones torch takes its
    unfused math path, three times slower on a decode step."""
    if span.chunk_selection is not None:
        span = span.narrowed(q, kv_cache, scale)
    keys, values = _context_kv(kv_cache, span).transpose(1, 2).unsqueeze(1)  # [1, KV, L, D] each
    num_heads, num_kv_heads = q.shape[1], keys.shape[1]
    if span.is_decode:
        grouped = q.view(1, num_kv_heads, num_heads // num_kv_heads, q.shape[2])  # head h uses kv head h // group
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=span.attn_mask, scale=scale)
        return out.reshape(1, num_heads, q.shape[2])
    if span.attn_mask is not None and num_kv_heads != num_heads:
        return _attend_grouped_chunk(q, keys, values, span, scale)
    if num_kv_heads != num_heads:
        keys = keys.repeat_interleave(num_heads // num_kv_heads, dim=1)
        values = values.repeat_interleave(num_heads // num_kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys, values, attn_mask=span.attn_mask,
                                         is_causal=span.attn_mask is None, scale=scale)
    return out.squeeze(0).transpose(0, 1)


def _attend_grouped_chunk(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, span: QuerySpan,
                          scale: float) -> torch.Tensor:
    """A chunk after a cached history: each KV head's query heads stacked into its query rows, the mask
    tiled to match, so the history's K/V are read in place once instead of copied once per query head."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    rows = q.view(num_tokens, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(1, num_kv_heads, -1, head_dim)
    out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=span.tiled_mask(group, q.dtype),
                                         scale=scale)
    return out.view(num_kv_heads, group, num_tokens, head_dim).permute(2, 0, 1, 3).reshape(num_tokens, num_heads,
                                                                                           head_dim)


def _context_kv(kv_cache: torch.Tensor, span: QuerySpan) -> torch.Tensor:
    """[2, context_len, KV, D]: a view of the cache when the span's slots are consecutive, else a gathered copy
    (by blocks when the context is whole blocks)."""
    if span.context_blocks is not None:
        return span.context_blocks.gather(kv_cache, span.context_len)
    first = span.first_slot
    if first is None:
        return kv_cache.index_select(1, span.context_slots)
    return kv_cache[:, first:first + span.context_len]
