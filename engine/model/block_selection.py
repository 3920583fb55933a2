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

from dataclasses import dataclass, field

import torch

ATTENTION_DECAY = 0.5


@dataclass
class RequestSummaries:
    block_ids: list[int] = field(default_factory=list)  # the request's full blocks summarised, in table order
    bounds: torch.Tensor | None = None  # [layers, 2 (min, max), blocks, kv_heads, head_dim]
    attended: torch.Tensor | None = None  # [blocks]: accumulated attention shares (the `attention` policy)


class BlockSummaries:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._requests: dict[str, RequestSummaries] = {}

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
    """queries [layers, heads, head_dim] of one token -> [blocks]: per layer and query head, the share of its
    attention over these blocks' tokens that each block gets; a block's score is its largest share."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0].device)
    heads, head_dim = queries.shape[1:]
    shares = []
    for layer, cache in enumerate(kv_caches):
        keys = cache[0].view(-1, block_size, *cache.shape[2:]).index_select(0, ids).float()  # [B, size, KV, D]
        kv_heads = keys.shape[2]
        grouped = queries[layer].float().view(kv_heads, heads // kv_heads, head_dim)
        logits = torch.einsum("kgd,bskd->kgbs", grouped, keys) * scale  # [KV, G, B, size]
        weights = torch.softmax(logits.flatten(2), dim=-1).view_as(logits)
        shares.append(weights.sum(dim=-1).amax(dim=(0, 1)))  # [B]
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
