"""Demand, in workers kept busy at the latency targets, from a `LoadSnapshot`: what `CapacityPolicy` moves
workers by (the module docstring of `policy.py` says how each term is read). Decode demand is the largest of
three: the streams' steps on the fitted decode line (plus the prompt tokens prefilled where they decode), the
requests over the engine's slots, and the KV the decode workers hold over what a worker should hold."""

from __future__ import annotations

from dataclasses import dataclass

from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import DECODE, LoadSnapshot


@dataclass(frozen=True)
class Demand:
    prefill: float  # workers the prefill load keeps busy
    decode: float
    decode_memory: float = 0.0  # decode workers whose KV the held histories fill to kv_target_usage (in `decode`)



def decode_s_per_token(snapshot: LoadSnapshot, settings: CapacitySettings) -> float:
    """Worker seconds per output token of one stream: the step time over the streams per decoding worker."""
    streams = [w.decode_streams for w in snapshot.workers if w.decode_streams]
    if not snapshot.tpot_s or not streams:
        return settings.decode_s_per_token
    return snapshot.tpot_s * len(streams) / sum(streams)


def decode_line(snapshot: LoadSnapshot, settings: CapacitySettings) -> tuple[float, float]:
    """A decode step's seconds against its streams, (base_s, per_stream_s): the workers' fitted line, else a line
    through 0 at the measured (or assumed) seconds per token, which no batch size makes cheaper."""
    return snapshot.decode_line or (0.0, decode_s_per_token(snapshot, settings))


def decode_workers(streams: float, line: tuple[float, float], target_tpot_s: float) -> float:
    """Decode workers `streams` keep busy at the target: spread over d workers each steps in base + per x
    streams / d, which meets the target from d = per x streams / (target - base) on. A stream is decoded on one
    worker, so it keeps at most one busy (also where the base alone misses the target)."""
    base, per_stream = line
    headroom = target_tpot_s - base
    if headroom <= 0:
        return streams
    return min(streams, per_stream * streams / headroom)


def demand(snapshot: LoadSnapshot, settings: CapacitySettings) -> Demand:
    horizon, drain_s = settings.forecast_horizon_s, settings.prefill_drain_s
    prefill_s_per_token = 1.0 / (snapshot.prefill_tokens_per_s or settings.prefill_tokens_per_s)
    remote, prompts, local = _prefill_split(snapshot)
    prefill = prefill_s_per_token * remote / drain_s
    if prompts is not None:  # one prompt is prefilled on one worker: it keeps at most that one busy
        prefill = min(prefill, prompts)
    share = 1.0 if snapshot.routed is None else snapshot.routed.remote_share  # forecast turns go as recent ones
    prefill += share * prefill_s_per_token * snapshot.forecast_prefill_tokens / horizon
    local_s = prefill_s_per_token * (local / drain_s + (1 - share) * snapshot.forecast_prefill_tokens / horizon)
    decode_tokens_per_s = _decode_owed(snapshot, settings) + snapshot.forecast_decode_tokens / horizon
    streams = decode_tokens_per_s * settings.target_tpot_s  # each owed a token every target_tpot_s
    decode = decode_workers(streams, decode_line(snapshot, settings), settings.target_tpot_s)
    memory = memory_workers(snapshot, settings)
    return Demand(prefill, max(decode + local_s, _slot_workers(snapshot), memory), memory)


def memory_workers(snapshot: LoadSnapshot, settings: CapacitySettings) -> float:
    """Decode workers the KV the decode workers hold needs, each filled to `kv_target_usage`: running requests and
    the histories pinned over a tool gap. Past it a decode worker evicts histories that the sessions' next turns
    then recompute, so a move out of decode that leaves the rest less room than this turns decode memory into
    prefill demand and invites its own reversal. 0 where no worker reports its KV."""
    held = [w.kv_usage for w in snapshot.workers if w.role == DECODE and w.kv_usage is not None]
    return sum(held) / settings.kv_target_usage


def _slot_workers(snapshot: LoadSnapshot) -> float:
    """Decode workers the requests need for their slots alone: a worker runs at most `max_streams_per_worker` at
    once and the rest wait, however cheap their steps. (At 12 swe sessions/s on one decode worker of 64 slots, the
    simulator's 120-140 requests read 0.7 workers by the TPOT line and compute, while half of them waited.)"""
    cap = snapshot.max_streams_per_worker
    if not cap:
        return 0.0
    admitted = snapshot.admitted
    requests = admitted.streams if admitted is not None else sum(
        w.running for w in snapshot.workers if w.role == DECODE)
    return requests / cap


def _prefill_split(snapshot: LoadSnapshot) -> tuple[int, int | None, int]:
    """(prompt tokens for the prefill workers, at most how many prompts they are, prompt tokens the decode
    workers prefill themselves and count as their load). The router's split where it reports one; else the
    admitted work's prompt tokens, or the workers' queues, less the prompt tokens queued on decode workers,
    which count for neither role (a worker's queue would change sides with its role, and a move invite its
    reversal)."""
    routed, admitted = snapshot.routed, snapshot.admitted
    if routed is not None:
        return routed.remote_tokens, routed.remote_prompts, routed.local_tokens
    queued_local = sum(w.waiting_prefill_tokens for w in snapshot.workers if w.role == DECODE)
    backlog = snapshot.prefill_tokens_waiting if admitted is None else admitted.prefill_tokens
    return max(0, backlog - queued_local), None if admitted is None else admitted.prompts, 0


def _decode_owed(snapshot: LoadSnapshot, settings: CapacitySettings) -> float:
    """Output tokens owed per second: a token every target_tpot_s per stream; an admitted stream no faster than
    its expected output spread over the forecast horizon."""
    admitted = snapshot.admitted
    if admitted is None:
        return snapshot.decode_streams / settings.target_tpot_s
    return min(admitted.streams / settings.target_tpot_s, admitted.decode_tokens / settings.forecast_horizon_s)
