"""The `query` and `attention` history policies on the device: per-block key summaries, the scores of a step's
queries, and the attention they actually gave.

Each full block of a request's history is summarised once, per layer, by the element-wise minimum and maximum
of its keys ([2, kv_heads, head_dim]: 2 x 64 x 3 x 4 = 1.5 KiB per layer for SmolLM2 in float32, against
24 KiB of K and V at 16 tokens a block). For a query q, sum_d max(q_d min_d, q_d max_d) bounds q.k from above
for every key k of the block (Quest), so a block no query can score high on is safe to skip. The scores of a
block are these bounds, softmaxed over the history per layer and query head, and its score their maximum: a
block stays when any head of any layer may look at it.

`attention` scores a block by the share of attention the request's own decode queries gave its tokens (exact
softmax over the history, per layer and head, its largest share), accumulated over the request's picks with
each older pick weighing ATTENTION_DECAY as much (H2O keeps the tokens with the most accumulated attention): a
block is kept for what was looked at, not for what could be.

Summaries are worked out from the KV cache itself, for the blocks that filled since the last selection, so
they follow the KV wherever it goes (a hand-off, a tier and back) and cost nothing to requests without the
policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from engine.model.mask import QuerySelection

ATTENTION_DECAY = 0.5


@dataclass(frozen=True)
class ChunkPicks:
    """What one prefill chunk's layers read of the history: the full blocks before `start`, and per layer those
    attended (ascending)."""

    start: int  # the chunk's first position
    end: int  # past its last
    block_size: int
    history_blocks: int
    attended: list[list[int]]

    def attended_positions(self, layer: int) -> set[int]:
        """The history positions this layer's queries read (the chunk itself and what follows aside)."""
        return {block * self.block_size + offset for block in self.attended[layer] for offset in range(self.block_size)}


@dataclass
class RequestSummaries:
    block_ids: list[int] = field(default_factory=list)  # the request's full blocks summarised, in table order
    bounds: torch.Tensor | None = None  # [layers, 2 (min, max), blocks, kv_heads, head_dim]
    attended: torch.Tensor | None = None  # [blocks]: accumulated attention shares (the `attention` policy)


class BlockSummaries:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._requests: dict[str, RequestSummaries] = {}
        self.chunk_picks: dict[str, list[ChunkPicks]] | None = None  # {}: each request's prefill picks are kept

    def record_chunk(self, request_id: str, start: int, end: int, chunk: ChunkSelection) -> None:
        """Keep what a prefill chunk's layers attended to, when asked to (`chunk_picks` not None; a benchmark
        reads it, and pops it)."""
        if self.chunk_picks is not None:
            picks = ChunkPicks(start, end, self.block_size, chunk.history_blocks, [list(p) for p in chunk.picked])
            self.chunk_picks.setdefault(request_id, []).append(picks)

    def bounds(self, request_id: str, block_ids: list[int], kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """[layers, 2, len(block_ids), kv_heads, head_dim] key minima and maxima of these full blocks (the first
        of the request's table), computing only the blocks not summarised before."""
        known = self._requests.setdefault(request_id, RequestSummaries())
        same = _common_prefix(known.block_ids, block_ids)
        if known.bounds is not None and same == len(block_ids) == len(known.block_ids):
            return known.bounds
        kept = None if known.bounds is None else known.bounds[:, :, :same]
        new = block_summaries(kv_caches, block_ids[same:], self.block_size)
        known.bounds = new if kept is None else torch.cat((kept, new), dim=2)
        known.block_ids = list(block_ids)
        return known.bounds

    def attention(self, request_id: str, queries: torch.Tensor, block_ids: list[int], kv_caches: list[torch.Tensor],
                  scale: float) -> torch.Tensor:
        """[len(block_ids)]: these full blocks' accumulated attention from the request's queries, this step's
        (queries [layers, heads, head_dim]) included."""
        known = self._requests.setdefault(request_id, RequestSummaries())
        shares = block_attention(queries, kv_caches, block_ids, self.block_size, scale)
        before = known.attended if known.attended is not None else shares.new_zeros(0)
        kept = before[:min(len(before), len(shares))] * ATTENTION_DECAY
        known.attended = shares + torch.nn.functional.pad(kept, (0, len(shares) - len(kept)))
        return known.attended

    def chunk_selection(self, request_id: str, selection: QuerySelection, start: int, end: int, block_ids: list[int],
                        kv_caches: list[torch.Tensor]) -> ChunkSelection | None:
        """What the layers of a prefill chunk [start, end) pick from, when it follows a history it may skip."""
        plan = selection.chunk_history(start, end, self.block_size)
        if plan is None:
            return None
        kept, room = plan
        bounds = None if selection.policy == "attention" else self.bounds(request_id, block_ids[:len(kept)], kv_caches)
        table = torch.tensor(block_ids[:-(-end // self.block_size)], dtype=torch.long)
        return ChunkSelection(table, self.block_size, torch.tensor(kept), room, selection.policy, bounds)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._requests)


def block_summaries(kv_caches: list[torch.Tensor], block_ids: list[int], block_size: int) -> torch.Tensor:
    """[layers, 2, blocks, kv_heads, head_dim]: per layer, each block's key minimum and maximum."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0].device)
    per_layer = []
    for cache in kv_caches:
        keys = cache[0].view(-1, block_size, *cache.shape[2:]).index_select(0, ids)  # [blocks, size, KV, D]
        low, high = torch.aminmax(keys, dim=1)
        per_layer.append(torch.stack((low, high)))
    return torch.stack(per_layer).float()


def block_scores(queries: torch.Tensor, bounds: torch.Tensor, scale: float) -> torch.Tensor:
    """queries [layers, heads, head_dim] of one token; bounds [layers, 2, blocks, kv_heads, head_dim] ->
    [blocks]: the most attention any layer's head could give the block, as a share of its history."""
    layers, heads, head_dim = queries.shape
    kv_heads = bounds.shape[3]
    grouped = queries.float().view(layers, kv_heads, heads // kv_heads, head_dim)
    upper = (torch.einsum("lkgd,lbkd->lbkg", grouped.clamp(min=0), bounds[:, 1])
             + torch.einsum("lkgd,lbkd->lbkg", grouped.clamp(max=0), bounds[:, 0]))
    return torch.softmax(upper * scale, dim=1).amax(dim=(0, 2, 3))


def block_attention(queries: torch.Tensor, kv_caches: list[torch.Tensor], block_ids: list[int], block_size: int,
                    scale: float) -> torch.Tensor:
    """queries [layers, heads, head_dim] of one token (or [layers, rows, heads, head_dim] of several) -> [blocks]:
    per layer, query row and head, the share of its attention over these blocks' tokens that each block gets; a
    block's score is its largest share."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0].device)
    rows = queries if queries.dim() == 4 else queries.unsqueeze(1)
    heads, head_dim = rows.shape[2:]
    shares = []
    for layer, cache in enumerate(kv_caches):
        keys = cache[0].view(-1, block_size, *cache.shape[2:]).index_select(0, ids).float()  # [B, size, KV, D]
        kv_heads = keys.shape[2]
        grouped = rows[layer].float().view(-1, kv_heads, heads // kv_heads, head_dim)
        logits = torch.einsum("rkgd,bskd->rkgbs", grouped, keys) * scale  # [rows, KV, G, B, size]
        weights = torch.softmax(logits.flatten(3), dim=-1).view_as(logits)
        shares.append(weights.sum(dim=-1).amax(dim=(0, 1, 2)))  # [B]
    return torch.stack(shares).amax(dim=0)


@dataclass
class QueryCapture:
    """The queries of some rows of a step, per layer, appended by each attention layer as it runs."""

    rows: torch.Tensor  # [N] long: rows of the flattened step
    per_layer: list[torch.Tensor] = field(default_factory=list)  # [N, heads, head_dim] each

    def add(self, q: torch.Tensor) -> None:
        self.per_layer.append(q.index_select(0, self.rows))

    def of_row(self, index: int) -> torch.Tensor:
        """[layers, heads, head_dim]: the queries of the index-th captured row."""
        return torch.stack([q[index] for q in self.per_layer])


def _common_prefix(a: list[int], b: list[int]) -> int:
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


SNAP_WINDOW = 16  # `attention` in a prefill chunk: its last rows' attention picks the blocks (SnapKV's window)


@dataclass
class ChunkSelection:
    """A prefill chunk that follows a long history under `query` or `attention`: each layer picks, with the
    chunk's own queries of that layer, `room` of the history's skippable full blocks (key bounds, Quest; or the
    attention of the chunk's last SNAP_WINDOW rows, SnapKV) and attends to them, the kept blocks and the chunk
    only. The history is the full blocks before the chunk; `picked` holds each layer's attended history blocks."""

    block_table: torch.Tensor  # [n] long: the request's blocks up to the chunk's end
    block_size: int
    kept: torch.Tensor  # [history blocks] bool: never skipped
    room: int  # skippable blocks each layer attends to
    policy: str
    bounds: torch.Tensor | None = None  # [layers, 2, history blocks, kv_heads, head_dim] (`query`)
    picked: list[list[int]] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)  # each layer's [history blocks] scores

    @property
    def history_blocks(self) -> int:
        return int(self.kept.numel())

    def attended_blocks(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float) -> torch.Tensor:
        """This layer's (the next one's, in order) attended history blocks, ascending, picked by q [rows, H, D]."""
        layer = len(self.picked)
        if self.policy == "attention":
            ids = self.block_table[:self.history_blocks].tolist()
            scores = block_attention(q[-SNAP_WINDOW:].unsqueeze(0), [kv_cache], ids, self.block_size, scale)
        else:
            assert self.bounds is not None
            scores = chunk_block_scores(q, self.bounds[layer].to(q.device), scale)
        self.scores.append(scores)
        candidates = (~self.kept).nonzero().squeeze(1)
        best = candidates[scores.to(candidates.device)[candidates].topk(self.room).indices]
        chosen = self.kept.clone()
        chosen[best] = True
        attended = chosen.nonzero().squeeze(1)
        self.picked.append(attended.tolist())
        return attended

    def to(self, device: torch.device) -> ChunkSelection:
        return replace(self, block_table=self.block_table.to(device), kept=self.kept.to(device),
                       bounds=None if self.bounds is None else self.bounds.to(device), picked=self.picked,
                       scores=self.scores)

    def decode_scores(self, num_blocks: int) -> list[float]:
        """The first decode pick's scores of the full blocks before the next token (num_blocks): each history
        block's best score over the layers (as a decode pick scores it), the chunk's own blocks (always kept) 0."""
        best = torch.stack(self.scores).amax(dim=0).tolist()
        return best + [0.0] * (num_blocks - len(best))


def chunk_block_scores(q: torch.Tensor, bounds: torch.Tensor, scale: float) -> torch.Tensor:
    """q [rows, heads, head_dim] of one layer; bounds [2, blocks, kv_heads, head_dim] -> [blocks]: the most
    attention any row's head could give the block (its key bound, softmaxed over the history)."""
    rows, heads, head_dim = q.shape
    kv_heads = bounds.shape[2]
    grouped = q.float().view(rows, kv_heads, heads // kv_heads, head_dim)
    upper = (torch.einsum("rkgd,bkd->rbkg", grouped.clamp(min=0), bounds[1])
             + torch.einsum("rkgd,bkd->rbkg", grouped.clamp(max=0), bounds[0]))
    return torch.softmax(upper * scale, dim=1).amax(dim=(0, 2, 3))
