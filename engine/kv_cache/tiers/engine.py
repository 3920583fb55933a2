"""The engine's side of the tiers: device blocks in and out of the TierChain through the block codec, with
the load-vs-recompute decision (EngineTiers, the pool's LowerTiers), and the hooks LLMEngine calls."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.kv_cache import wire as kv_wire
from engine.kv_cache.keys import block_key, model_fingerprint, namespace
from engine.kv_cache.manager import HeldBlocks, KVCacheManager
from engine.kv_cache.policy import make_policy
from engine.kv_cache.settings import KVCacheSettings
from engine.kv_cache.tiers.chain import Tier, TierChain
from engine.kv_cache.tiers.decision import LoadDecision
from engine.kv_cache.tiers.device_io import BlockCodec
from engine.kv_cache.tiers.prefetch import PrefetchSchedule
from engine.kv_cache.tiers.stores import BlockStore, FileStore, RedisStore, StoreUnavailable
from engine.model.runner import ModelRunner

logger = logging.getLogger(__name__)


def default_host_path() -> Path:
    return Path("/dev/shm") / f"agentserve-kv-{os.getuid()}"


def build_chain(settings: KVCacheSettings, clock: Callable[[], float] = time.monotonic) -> TierChain | None:
    """The tiers the settings turn on; None when there are none. A store that cannot start is left out."""
    host = _open(lambda: FileStore("host", settings.host_path or default_host_path())) if settings.host_blocks else None
    persistent: list[BlockStore | None] = []
    if settings.disk_path is not None:
        persistent.append(_open(lambda: FileStore("disk", settings.disk_path, settings.disk_max_bytes)))  # type: ignore[arg-type]
    if settings.redis_url is not None:
        persistent.append(RedisStore(settings.redis_url, settings.redis_ttl_s))  # connects lazily
    stores = [store for store in persistent if store is not None]
    if host is None and not stores:
        return None
    policy = make_policy(settings.eviction, settings.weights, max(settings.host_blocks, 1))
    return TierChain(host, settings.host_blocks, stores, policy, clock=clock)


def _open(make: Callable[[], BlockStore]) -> BlockStore | None:
    try:
        return make()
    except StoreUnavailable as error:
        logger.warning("KV tier left out: %s", error)
        return None


class EngineTiers:
    def __init__(self, chain: TierChain, codec: BlockCodec, decision: LoadDecision, model: str, mask_rule: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.chain, self.codec, self.decision = chain, codec, decision
        self.space = namespace(model, mask_rule)
        self.clock = clock
        self.block_nbytes = 0  # learned from the first encoded block
        self.located: dict[int, Tier] = {}  # block hash -> tier, from the last `loadable`, for `load`

    def _key(self, block_hash: int) -> str:
        return block_key(self.space, block_hash)

    def loadable(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks some tier holds and that are cheaper to load than to recompute; once one is not,
        it and every later block a tier holds count as recomputed (a prefix loads, or nothing after it)."""
        count, recompute = 0, False
        self.located.clear()
        for block_hash in block_hashes:
            tier = self.chain.locate(self._key(block_hash))
            if tier is None:
                break
            recompute = recompute or not self.decision.worth_loading(tier.name, self.block_nbytes,
                                                                     self.codec.block_size)
            if recompute:
                self.decision.recomputed += 1
                continue
            self.located[block_hash] = tier
            count += 1
        return count

    def load(self, block_hash: int, block_id: int) -> bool:
        key = self._key(block_hash)
        tier = self.located.pop(block_hash, None) or self.chain.locate(key)
        started = time.perf_counter()
        data = self.chain.get(tier, key) if tier is not None else None
        if tier is None or data is None:
            return False
        try:
            self.codec.decode_into(data, block_hash, block_id)
        except kv_wire.KVWireError as error:
            logger.warning("KV block %016x in tier %s failed its checks (%s): recomputed", block_hash, tier.name,
                           error)
            self.chain.discard(tier, key)
            return False
        self.decision.observe(tier.name, len(data), time.perf_counter() - started)
        self.decision.loaded += 1
        self.block_nbytes = len(data)
        return True

    def demote(self, block_hash: int, block_id: int) -> None:
        data = self._encode(block_hash, block_id)
        self.chain.demote(self._key(block_hash), data, self.clock())

    def persist(self, block_hashes: Sequence[int], block_ids: Sequence[int]) -> None:
        """Write full blocks through to the persistent stores (a session's turn), so a restart finds them."""
        for block_hash, block_id in zip(block_hashes, block_ids, strict=False):
            key = self._key(block_hash)
            if self.chain.needs_persist(key):
                self.chain.persist(key, self._encode(block_hash, block_id))

    def _encode(self, block_hash: int, block_id: int) -> bytes:
        data = self.codec.encode(block_hash, block_id)
        self.block_nbytes = len(data)
        return data


class TierHooks:
    """What the engine calls: at a session turn's end, every step (prefetch), at shutdown, for metrics."""

    def __init__(self, tiers: EngineTiers, prefetch: PrefetchSchedule) -> None:
        self.tiers, self.prefetch = tiers, prefetch

    def turn_finished(self, key: str, held: HeldBlocks) -> None:
        hashes = tuple(held.block_hashes)
        self.prefetch.remember(key, hashes)
        self.tiers.persist(hashes, [block.block_id for block in held.blocks])

    def promote_due(self, kv: KVCacheManager, now: float) -> int:
        return sum(kv.promote(chain) for chain in self.prefetch.pop_due(now))

    def flush(self, kv: KVCacheManager) -> None:
        """Write every cached device block through to the persistent stores (a graceful shutdown)."""
        cached = list(kv.pool.cached.items())
        self.tiers.persist([h for h, _ in cached], [block.block_id for _, block in cached])

    def close(self) -> None:
        """The stores' connections (the engine is done with them); what they hold stays."""
        self.tiers.chain.close()

    def stats(self) -> dict[str, Any]:
        self.tiers.chain.refresh_held()
        decision = self.tiers.decision
        return {"tiers": {tier.name: asdict(tier.stats) for tier in self.tiers.chain.tiers},
                "loaded": decision.loaded, "recomputed": decision.recomputed,
                "bytes_per_s": dict(decision.bytes_per_s), "prefetch": asdict(self.prefetch.stats)}


def total_tier_stats(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Several engines' `TierHooks.stats` as one (a disaggregated engine's workers): counters summed, per tier
    and in all, a tier's bandwidth averaged over the engines that measured it; None when there are none."""
    if not parts:
        return None
    names = dict.fromkeys(name for part in parts for name in part["tiers"])
    bandwidths = {name: [part["bytes_per_s"][name] for part in parts if name in part["bytes_per_s"]]
                  for name in names}
    return {"tiers": {name: _sum_counts(part["tiers"][name] for part in parts if name in part["tiers"])
                      for name in names},
            "loaded": sum(part["loaded"] for part in parts), "recomputed": sum(part["recomputed"] for part in parts),
            "bytes_per_s": {name: sum(rates) / len(rates) for name, rates in bandwidths.items() if rates},
            "prefetch": _sum_counts(part["prefetch"] for part in parts)}


def _sum_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for name, value in one.items():
            total[name] = total.get(name, 0) + value
    return total


def make_tier_hooks(settings: KVCacheSettings, runner: ModelRunner, identity: dict[str, Any],
                    prefill_tokens_per_s: Callable[[], float]) -> TierHooks | None:
    chain = build_chain(settings)
    if chain is None:
        return None
    decision = LoadDecision(prefill_tokens_per_s, settings.load_speedup)
    tiers = EngineTiers(chain, BlockCodec(runner), decision, model_fingerprint(identity), settings.mask_rule)
    return TierHooks(tiers, PrefetchSchedule(settings.prefetch_lead_s))
