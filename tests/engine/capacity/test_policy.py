"""The split on scripted loads. Default rates: one worker prefills 5000 queued tokens within prefill_drain_s
(10000 tokens/s x 0.5 s) and decodes 10 streams at target_tpot_s (0.005 worker s per token / 0.05 s)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.capacity.policy import CapacityPolicy, Decision, Demand, Move, demand
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import (
    DECODE,
    PREFILL,
    AdmittedWork,
    LoadSnapshot,
    RoutedPrefills,
    RoutedWork,
    WorkerLoad,
    role_figures,
)

P, D = PREFILL, DECODE


def snapshot(roles: str, now: float = 10.0, waiting: int = 0, streams: int = 0,
             switched: dict[int, float] | None = None, running: tuple[int, ...] | None = None,
             **fields: object) -> LoadSnapshot:
    """Workers from a role string ("PPD": 0 and 1 prefill, 2 decode); the queue on the prefill workers, the
    streams on the decode workers (evenly, the remainder on the lowest ids)."""
    prefill = [i for i, r in enumerate(roles) if r == "P"]
    decode = [i for i, r in enumerate(roles) if r == "D"]
    workers = []
    for i, role in enumerate(roles):
        queue = waiting // len(prefill) if i in prefill else 0
        mine = (streams // len(decode) + (decode.index(i) < streams % len(decode))) if i in decode else 0
        load = running[i] if running else int(queue > 0) + mine
        workers.append(WorkerLoad(i, P if role == "P" else D, load, queue, mine, (switched or {}).get(i)))
    return LoadSnapshot(now, tuple(workers), **fields)  # type: ignore[arg-type]


def apply(snap: LoadSnapshot, decision: Decision) -> LoadSnapshot:
    moved = dict(decision.moves)
    workers = tuple(replace(w, role=moved[w.worker_id], last_switch_at=snap.now) if w.worker_id in moved else w
                    for w in snap.workers)
    return replace(snap, workers=workers)


@pytest.fixture
def policy() -> CapacityPolicy:
    """Instantaneous demand: each snapshot is judged on its own (smoothing has its own test)."""
    return CapacityPolicy(CapacitySettings(demand_smoothing_s=0))


def test_smoothing_lets_a_burst_pass_and_follows_a_lasting_load() -> None:
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=2.0, hold_s=0))
    assert policy.decide(snapshot("PDDD", now=0.0, streams=30)).prefill == 1
    burst = policy.decide(snapshot("PDDD", now=0.1, waiting=20000, streams=30))
    assert burst.prefill == 1 and burst.demand.prefill == pytest.approx(4.0 * (1 - 2.718281828 ** -0.05), rel=1e-3)
    lasting = [policy.decide(snapshot("PDDD", now=0.1 + 0.1 * i, waiting=20000, streams=30)) for i in range(1, 40)]
    assert lasting[-1].prefill >= 2  # after a few time constants the demand is the queue's


def test_admitted_work_replaces_the_queues_and_is_not_smoothed() -> None:
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=2.0, hold_s=0))
    quiet = policy.decide(snapshot("PPDD", now=0.0, waiting=50000, streams=40, admitted=AdmittedWork()))
    assert quiet.demand == Demand(0.0, 0.0) and quiet.moves == ()  # the queues' 10 and 4 workers are not read
    work = AdmittedWork(prefill_tokens=20000, decode_tokens=640, streams=10, prompts=4)
    burst = policy.decide(snapshot("PPDD", now=0.1, admitted=work))
    assert burst.demand.prefill == pytest.approx(4.0)  # 20000 tokens x 1e-4 s / 0.5 s, at once
    assert burst.demand.decode == pytest.approx(1.0)  # 10 streams x 0.005 s / 0.05 s
    assert burst.moves == (Move(2, P),) and "admitted" in burst.reason


def test_an_admitted_prompt_keeps_at_most_one_worker_busy(policy: CapacityPolicy) -> None:
    one_long_prompt = snapshot("PDDD", admitted=AdmittedWork(prefill_tokens=30000, prompts=1))
    assert demand(one_long_prompt, policy.settings).prefill == pytest.approx(1.0)  # not 6: one worker prefills it
    assert policy.decide(one_long_prompt).moves == ()


def test_an_admitted_stream_is_owed_no_more_than_its_expected_tokens(policy: CapacityPolicy) -> None:
    short = snapshot("PD", admitted=AdmittedWork(decode_tokens=5, streams=10))  # 5 tokens over the 1 s horizon
    assert demand(short, policy.settings).decode == pytest.approx(5 * 0.005)
    long = snapshot("PD", admitted=AdmittedWork(decode_tokens=5000, streams=10))  # a token per 50 ms each
    assert demand(long, policy.settings).decode == pytest.approx(10 / 0.05 * 0.005)


def test_the_split_moves_toward_the_load(policy: CapacityPolicy) -> None:
    decision = policy.decide(snapshot("PPDD", waiting=15000, streams=10, running=(3, 3, 5, 3)))
    assert (decision.prefill, decision.decode) == (3, 1)
    assert decision.moves == (Move(3, P),)  # the least-loaded decode worker
    assert decision.demand.prefill == pytest.approx(3.0) and decision.demand.decode == pytest.approx(1.0)
    decision = policy.decide(snapshot("PPDD", waiting=5000, streams=30))
    assert (decision.prefill, decision.moves) == (1, (Move(0, D),))


def test_forecasts_count_like_queued_work(policy: CapacityPolicy) -> None:
    decision = policy.decide(snapshot("PPDD", forecast_prefill_tokens=30000.0, forecast_decode_tokens=200.0))
    assert decision.demand.prefill == pytest.approx(3.0) and decision.demand.decode == pytest.approx(1.0)
    assert decision.moves == (Move(2, P),)


def test_measured_speeds_replace_the_assumed_ones(policy: CapacityPolicy) -> None:
    slow_decode = snapshot("PD", streams=10, tpot_s=0.1)  # one worker, 10 streams, twice the target TPOT
    assert demand(slow_decode, policy.settings).decode == pytest.approx(2.0)
    fast_prefill = snapshot("PD", waiting=20000, prefill_tokens_per_s=40000.0)
    assert demand(fast_prefill, policy.settings).prefill == pytest.approx(1.0)


def test_a_split_under_which_every_role_meets_its_target_stays(policy: CapacityPolicy) -> None:
    assert policy.decide(snapshot("PPDD", waiting=9000, streams=19)).moves == ()  # 1.8 and 1.9 workers on 2 each
    assert policy.decide(snapshot("PPDD", waiting=500, streams=19)).moves == ()  # skewed, but each role fits


def test_an_imbalance_within_the_demand_margin_stays(policy: CapacityPolicy) -> None:
    within = policy.decide(snapshot("PPDD", waiting=12000, streams=10))  # 1.2 per prefill worker, 1.0 after
    assert within.moves == () and (within.prefill, within.decode) == (2, 2)
    beyond = policy.decide(snapshot("PPDD", waiting=13000, streams=10))  # 1.3 against 1.0: past the 0.25 margin
    assert beyond.moves == (Move(2, P),)
    wide = CapacityPolicy(CapacitySettings(demand_smoothing_s=0, demand_margin=0.5))
    assert wide.decide(snapshot("PPDD", waiting=13000, streams=10)).moves == ()


@settings(max_examples=200, deadline=None)
@given(roles=st.text("PD", min_size=2, max_size=6), waiting=st.integers(0, 80000), streams=st.integers(0, 120))
def test_a_move_never_invites_its_reversal_at_the_same_demand(roles: str, waiting: int, streams: int) -> None:
    if "P" not in roles or "D" not in roles:
        return
    """A moved worker keeps its queue, so a prefill worker moved to decode turns its queued prompts into local
    work the prefill demand no longer counts: another may follow it, none come back."""
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=0, hold_s=0))
    before = snapshot(roles, waiting=waiting, streams=streams)
    first = policy.decide(before)
    then = policy.decide(apply(before, first)).moves
    assert {m.role for m in then} <= {m.role for m in first.moves}
    if not any(m.role == DECODE for m in first.moves):  # nothing changed sides: the same demand, no move
        assert then == ()


@settings(max_examples=300, deadline=None)
@given(roles=st.text("PD", min_size=1, max_size=6), remote=st.integers(0, 80000), local=st.integers(0, 20000),
       streams=st.integers(0, 120), floor=st.sampled_from([0, 1]))
def test_with_the_routers_split_no_move_invites_its_reversal(roles: str, remote: int, local: int, streams: int,
                                                             floor: int) -> None:
    """The router's split does not change with the roles: whatever the split and the floor, the next decision at
    the same demand moves nothing back (a role left with no worker included)."""
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=0, hold_s=0, min_per_role=floor))
    routed = RoutedWork(remote, -(-remote // 4000), local)
    before = snapshot(roles, streams=streams if "D" in roles else 0, routed=routed,
                      admitted=AdmittedWork(decode_tokens=40 * streams, streams=streams))
    first = policy.decide(before)
    then = policy.decide(apply(before, first)).moves
    assert {m.role for m in then} <= {m.role for m in first.moves}


def test_prompts_queued_on_decode_workers_are_not_prefill_demand(policy: CapacityPolicy) -> None:
    """Conditional disaggregation prefilled 24,000 of the 30,000 admitted prompt tokens where they decode: more
    prefill workers would not serve those sooner."""
    work = AdmittedWork(prefill_tokens=30000, prompts=10)
    workers = (WorkerLoad(0, P, 1, 6000), WorkerLoad(1, D, 5, 12000, 2), WorkerLoad(2, D, 5, 12000, 2))
    need = demand(LoadSnapshot(10.0, workers, admitted=work), CapacitySettings())
    assert need.prefill == pytest.approx(6000 / 10000 / 0.5)  # the prefill worker's share, at the assumed rate
    remote = (WorkerLoad(0, P, 1, 30000), WorkerLoad(1, D, 2, 0, 2), WorkerLoad(2, D, 2, 0, 2))
    assert demand(LoadSnapshot(10.0, remote, admitted=work), CapacitySettings()).prefill == pytest.approx(6.0)


def test_the_hold_delays_an_unclear_reversal_but_not_a_clear_one(policy: CapacityPolicy) -> None:
    think = snapshot("PDD", now=0.0, waiting=20000, streams=5)  # 3 streams on worker 1, 2 on worker 2
    decision = policy.decide(think)
    assert decision.moves == (Move(2, P),)
    assert [w.last_switch_at for w in apply(think, decision).workers] == [None, None, 0.0]
    # Decode misses its target, but prefill's 1.2 workers would not fit in the one worker it keeps: held.
    for now in (0.1, 1.0, 1.99):
        held = policy.decide(snapshot("PDP", now=now, waiting=6000, streams=40, switched={2: 0.0}))
        assert held.moves == () and held.prefill == 1 and "held" in held.reason
    after = policy.decide(snapshot("PDP", now=2.0, waiting=6000, streams=40, switched={2: 0.0}, running=(2, 40, 0)))
    assert after.moves == (Move(2, D),)  # the least loaded prefill worker
    # Prefill has nothing left to do and decode needs more than its worker: the demand asks clearly, at once.
    clear = policy.decide(snapshot("PDP", now=0.1, streams=15, switched={2: 0.0}))
    assert clear.moves and "held" not in clear.reason


def test_each_busy_role_keeps_a_worker(policy: CapacityPolicy) -> None:
    flood = policy.decide(snapshot("PDD", waiting=10**7, streams=1))
    assert (flood.prefill, flood.decode) == (2, 1)
    assert policy.decide(snapshot("PPD", streams=10**4, waiting=1)).prefill == 1
    only_decode = policy.decide(snapshot("PPPD", streams=50))
    assert (only_decode.prefill, only_decode.decode) == (1, 3)


def test_no_load_keeps_the_split(policy: CapacityPolicy) -> None:
    decision = policy.decide(snapshot("PPPD"))
    assert decision.moves == () and (decision.prefill, decision.decode) == (3, 1) and "no load" in decision.reason


def test_a_shift_event_moves_ahead_of_the_queue(policy: CapacityPolicy) -> None:
    assert policy.decide(snapshot("PPDD", waiting=10000, streams=20)).moves == ()  # balanced
    to_think = policy.decide(snapshot("PPDD", waiting=10000, streams=20, shift="think"))
    assert to_think.moves == (Move(2, P),) and "shift to think" in to_think.reason
    assert policy.decide(snapshot("PPDD", waiting=10000, streams=20, shift="act")).moves == (Move(0, D),)
    by_share = policy.decide(snapshot("PDDDD", shift="think", think_share=0.8))
    assert by_share.prefill == 4  # round(5 x 0.8), ahead of an empty queue
    assert policy.decide(snapshot("PPDD", shift="act", think_share=0.0)).prefill == 1  # the floor still holds


def test_a_pinned_split_overrides_load_floor_and_hold(policy: CapacityPolicy) -> None:
    policy.pin(0, 3)
    decision = policy.decide(snapshot("PPD", waiting=10**6, switched={0: 9.9, 1: 9.9}))
    assert (decision.prefill, decision.decode) == (0, 3) and set(decision.moves) == {Move(0, D), Move(1, D)}
    assert decision.reason.startswith("pinned")
    policy.pin(1, 3)
    assert policy.decide(snapshot("DD")).moves == (Move(0, P),)  # 1 of 4 scaled to 2 workers, rounded up
    policy.unpin()
    assert policy.decide(snapshot("PPD", waiting=10**6, streams=1)).moves == ()
    with pytest.raises(ValueError, match="pinned split"):
        policy.pin(-1, 2)
    assert CapacityPolicy(CapacitySettings(pinned_split=(2, 1))).decide(snapshot("PDD")).prefill == 2


def test_disabled_controller_moves_nothing() -> None:
    policy = CapacityPolicy(CapacitySettings(enabled=False))
    assert policy.decide(snapshot("PDDD", waiting=10**6)).moves == ()


def test_decisions_are_deterministic(policy: CapacityPolicy) -> None:
    tied = snapshot("PPDDD", waiting=40000, streams=0, running=(1, 1, 0, 0, 0))
    first, second = policy.decide(tied), policy.decide(tied)
    assert first == second and first.moves == (Move(2, P), Move(3, P))


def test_a_scripted_think_act_swing(policy: CapacityPolicy) -> None:
    """Think-heavy for 3 s, then act-heavy: the split follows each phase and no worker flaps."""
    snap = snapshot("PPDDDD", now=0.0)
    switches: dict[int, list[float]] = {}
    for tick in range(80):
        now = tick * 0.1
        waiting, streams = (40000, 5) if now < 3.0 else (2000, 45)
        current = snapshot("".join("P" if w.role == P else "D" for w in snap.workers), now=now, waiting=waiting,
                           streams=streams, switched={w.worker_id: w.last_switch_at for w in snap.workers
                                                      if w.last_switch_at is not None})
        decision = policy.decide(current)
        for move in decision.moves:
            switches.setdefault(move.worker_id, []).append(now)
        snap = apply(current, decision)
        if tick == 29:
            assert snap.count(P) == 5
    assert snap.count(P) == 1
    for times in switches.values():
        assert all(later - earlier >= 2.0 for earlier, later in itertools.pairwise(times))


def test_policy_modules_import_no_torch() -> None:
    code = ("import sys; import engine.capacity.policy, engine.capacity.routing, engine.capacity.alerts, "
            "engine.capacity.events; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_admitted_work_adds_up_and_cannot_go_negative() -> None:
    work = AdmittedWork(100, 64, 2, 1) + AdmittedWork(50, 16, 1, 1)
    assert work == AdmittedWork(150, 80, 3, 2) and work - AdmittedWork(150, 0, 0, 2) == AdmittedWork(0, 80, 3, 0)
    with pytest.raises(ValueError, match="negative"):
        AdmittedWork(10) - AdmittedWork(20)


def test_routed_prompts_split_the_prefill_work_between_the_roles() -> None:
    """The router's split replaces the queues': its gated prompts are the prefill workers' demand (at most one
    worker each), its local ones add to the decode workers' at the same seconds per token and drain time."""
    settings = CapacitySettings()
    workers = (WorkerLoad(0, P, 0, 0), WorkerLoad(1, D, 1, 40000))  # its queue would say otherwise
    local_only = demand(LoadSnapshot(10.0, workers, routed=RoutedWork(local_tokens=5000)), settings)
    assert local_only.prefill == 0 and local_only.decode == pytest.approx(5000 / 10000 / 0.5)
    gated = demand(LoadSnapshot(10.0, workers, routed=RoutedWork(remote_tokens=30000, remote_prompts=2)), settings)
    assert gated.prefill == pytest.approx(2.0) and gated.decode == 0
    # the forecast prompt tokens split as the recent placements did: a quarter of their tokens went to prefill
    forecast = demand(LoadSnapshot(10.0, workers, forecast_prefill_tokens=8000, routed=RoutedWork(remote_share=0.25)),
                      settings)
    assert (forecast.prefill, forecast.decode) == pytest.approx((0.2, 0.6))  # 2,000 and 6,000 tokens over 1 s


def test_a_workload_of_local_turns_gives_the_prefill_worker_to_decode() -> None:
    """With `min_per_role` 0: every turn passes the local gate, so the prefill worker has nothing to do while decode
    misses its target; it moves. A turn that fails the gate then falls on the decode workers, and stays there while
    decode is the busier; a shift to think brings a prefill worker back ahead of the queue."""
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=0, min_per_role=0))
    agent_turns = snapshot("PD", streams=30, admitted=AdmittedWork(decode_tokens=3000, streams=30, prompts=4,
                                                                    prefill_tokens=800),
                           routed=RoutedWork(local_tokens=800))
    to_decode = policy.decide(agent_turns)
    assert (to_decode.prefill, to_decode.decode, to_decode.moves) == (0, 2, (Move(0, D),))
    assert policy.decide(replace(apply(agent_turns, to_decode), now=10.1)).moves == ()  # and it stays
    large = replace(apply(agent_turns, to_decode), now=12.1, routed=RoutedWork(4000, 1, 800))
    assert policy.decide(large).moves == ()  # 0.8 workers of prefill on two decode workers, not 3.2 of decode on one
    think = policy.decide(replace(large, shift="think"))
    assert (think.prefill, think.decode, think.moves) == (1, 1, (Move(0, P),))


def test_a_role_with_no_worker_takes_one_back_only_when_the_other_can_spare_it() -> None:
    """With `min_per_role` 0 and no prefill worker, the gated prompts run on the decode workers: one worker goes
    back to prefill once decode meets its target on the rest, never while both roles are over theirs (at an
    overload a move only trades one role's misses for the other's)."""
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=0, hold_s=0, min_per_role=0))

    def load(streams: int, gated_tokens: int, prompts: int) -> LoadSnapshot:
        return snapshot("DD", streams=streams, routed=RoutedWork(gated_tokens, prompts),
                        admitted=AdmittedWork(decode_tokens=100 * streams, streams=streams))

    light = policy.decide(load(streams=5, gated_tokens=5000, prompts=2))  # prefill 1.0 workers, decode 0.5
    assert (light.prefill, light.decode, light.moves) == (1, 1, (Move(1, P),))
    assert policy.decide(apply(load(5, 5000, 2), light)).moves == ()  # and it stays
    for streams in (10, 30):  # decode needs both (1.0), or is over its target on both (3.0): no move
        assert policy.decide(load(streams, gated_tokens=20000, prompts=4)).moves == ()
    assert policy.decide(load(streams=5, gated_tokens=1000, prompts=1)).moves == ()  # 0.2 workers: within the margin


def test_requests_past_a_workers_slots_are_decode_demand_however_cheap_their_steps() -> None:
    """A worker runs at most max_num_seqs requests; the rest wait for a slot. 130 admitted requests on one decode
    worker of 64 slots, at a step cost that reads 0.1 workers, ask for 2: the idle prefill worker moves, and no
    gated prompt takes it back while the requests need both workers' slots."""
    policy = CapacityPolicy(CapacitySettings(demand_smoothing_s=0, hold_s=0, min_per_role=0))
    slots = snapshot("PD", streams=64, running=(0, 130), decode_line=(0.0003, 0.00005), routed=RoutedWork(),
                     admitted=AdmittedWork(decode_tokens=4000, streams=130), max_streams_per_worker=64)
    assert demand(slots, policy.settings).decode == pytest.approx(130 / 64)
    to_decode = policy.decide(slots)
    assert (to_decode.prefill, to_decode.decode, to_decode.moves) == (0, 2, (Move(0, D),))
    gated = replace(apply(slots, to_decode), routed=RoutedWork(5000, 2))  # a prefill worker's work, none to do it
    assert policy.decide(gated).moves == ()
    unbounded = replace(slots, max_streams_per_worker=None)
    assert demand(unbounded, policy.settings).decode < 0.2 and policy.decide(unbounded).moves == ()
    queues = replace(slots, admitted=None)  # without the gateway's account, the decode workers' requests
    assert demand(queues, policy.settings).decode == pytest.approx(130 / 64)


def test_a_role_with_no_worker_is_measured_on_the_others() -> None:
    """The decode line and step time come from the decode workers, else from any worker: with 2 / 0 the fallback
    seconds per token (10x the tiny model's) once read the agent's 0.6 workers of decode as 7.6, and the split
    flapped between 2 / 0 and 0 / 2."""
    line = (0.0004, 0.00048)
    assert role_figures(D, [(P, line), (P, None)]) == [line]
    assert role_figures(D, [(P, 0.004), (D, 0.0)]) == [0.004]  # a decode worker that has not stepped yet
    assert role_figures(P, [(P, 2000.0), (D, 9000.0)]) == [2000.0]
    assert role_figures(D, []) == []
    no_decoder = snapshot("PP", routed=RoutedWork(), decode_line=line,
                          admitted=AdmittedWork(decode_tokens=5800, streams=58))
    assert demand(no_decoder, CapacitySettings()).decode == pytest.approx(0.00048 * 58 / (0.05 - 0.0004))


def test_the_router_reports_a_prompt_from_its_placement_to_its_first_token() -> None:
    routed = RoutedPrefills()
    assert routed.work() is None  # nothing placed: nothing routes here, the policy reads the queues
    routed.placed("a", 2048, True)
    routed.placed("b", 64, False)
    routed.placed("c", 32, False)
    share = 0.95 ** 2 * 2048 / (0.95 ** 2 * 2048 + 0.95 * 64 + 32)  # the recent placements' tokens, decayed
    assert routed.work() == RoutedWork(remote_tokens=2048, remote_prompts=1, local_tokens=96,
                                       remote_share=pytest.approx(share))
    routed.placed("a", 100, False)  # re-run after its worker died: placed again, small this time
    routed.done("b")
    routed.done("b")  # its later outputs, and unknown ids, change nothing
    routed.done("unknown")
    assert routed.work() == RoutedWork(local_tokens=132, remote_share=pytest.approx(share * (1 - 100 / (
        0.95 * (0.95 ** 2 * 2048 + 0.95 * 64 + 32) + 100))))
    routed.done("a")
    routed.done("c")
    work = routed.work()
    assert work is not None and (work.remote_tokens, work.remote_prompts, work.local_tokens) == (0, 0, 0)


def _with_kv(snap: LoadSnapshot, usage: float) -> LoadSnapshot:
    """Every decode worker holding `usage` of its KV blocks (running requests and pinned histories)."""
    return replace(snap, workers=tuple(replace(w, kv_usage=usage) if w.role == D else w for w in snap.workers))


def test_decode_never_gives_a_worker_its_held_kv_needs(policy: CapacityPolicy) -> None:
    """A prefill burst of 3 workers on PDDDD moves decode workers only while the rest hold the decode KV at
    kv_target_usage (0.9): at 0.5 held on each of 4 (2.2 workers of KV) one may go (3 left), at 0.7 (3.1 workers)
    none. (In the simulated 27B-MoE swing, moving two decode nodes to prefill on such bursts filled the other
    two's KV; the evicted histories came back as prefill demand, and the controller moved 4-20 times a window.)"""
    burst = snapshot("PDDDD", routed=RoutedWork(15000, 3), admitted=AdmittedWork(15000, 40, 4, 3))
    assert policy.decide(burst).moves == (Move(1, P), Move(2, P))  # no KV reported: compute alone
    half = _with_kv(burst, 0.5)
    assert demand(half, policy.settings).decode_memory == pytest.approx(4 * 0.5 / 0.9)
    assert policy.decide(half).moves == (Move(1, P),)
    assert policy.decide(_with_kv(burst, 0.7)).moves == ()


def test_decode_kv_past_its_target_takes_a_worker_back(policy: CapacityPolicy) -> None:
    """Decode workers whose KV is full (histories being evicted) are over their target by the memory alone, and
    an idle prefill worker moves to decode however cheap the streams' steps are."""
    full = _with_kv(snapshot("PPDD", streams=4, admitted=AdmittedWork(0, 40, 4, 0), routed=RoutedWork()), 1.0)
    need = demand(full, policy.settings)
    assert need.decode == pytest.approx(2 / 0.9) and need.decode_memory == need.decode
    assert policy.decide(full).moves == (Move(0, D),)
