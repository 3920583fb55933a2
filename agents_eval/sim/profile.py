"""`agentserve profile`: the real engine's step times against batch composition on this machine, fitted into a
calibration file (`calibration`) that `agentserve simulate` reads instead of the roofline.

Rounds of requests with random token ids (prompt lengths and batch sizes from the lists below, replies of
`--max-tokens` with ignore_eos) go through `LLMEngine`; each step's batch is read off the engine's own
scheduler (the sequences it scheduled and their cached tokens) and timed around `LLMEngine.step`. Then agent
turns: a delta of a few to a hundred tokens on a cached prefix (the previous request's prompt), one or several
together, and the same turn joining requests that are decoding (one step mixing its chunk with their tokens,
as a busy engine runs it). Then the idle penalty: the same cached-prefix turn after idle gaps of `IDLE_GAPS_S`,
its first step against the same turn run back to back. Then the co-run slowdown: a set of
fresh-prompt rounds timed alone and again beside a second engine process decoding four streams (two workers of
a deployment on one host share its memory bandwidth and cache), per step kind. Last, through a worker process
(the colocated engine process, stepped as the validation steps the disaggregated one): the hop, the idle
turn's TTFT through it against the same in process, taken in turn, and the worker process's own idle penalty, its TTFT
after each gap.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents_eval.sim.calibration import StepSample, fit, kind
from agents_eval.sim.cost import StepWork
from agents_eval.sim.real_runs import POLL_S, Step, in_process, through_processes
from engine.core.sampling.sampler import SamplingParams

if TYPE_CHECKING:
    from engine.core.llm_engine import LLMEngine
    from engine.core.scheduler import ScheduledBatch

PROMPT_LENGTHS = (16, 128, 512, 1024)
BATCH_SIZES = (1, 2, 4, 8, 16)
CACHED_PREFIXES = (256, 512, 1024)  # an agent turn's history, in the prefix cache
TURN_DELTAS = (8, 32, 128)  # its new tokens
TURN_BATCHES = (1, 4)
DECODERS = (1, 2, 4)  # requests decoding while a turn arrives
IDLE_GAPS_S = (0.25, 0.5, 1.0, 2.0, 4.0)
IDLE_REPEATS = 5
IDLE_TURN = (512, 8)  # (cached prefix, delta) of the turn timed after each gap
HOP_PAIRS = 10  # the idle turn in process and through a worker process, in turn
CO_RUN_ROUNDS = ((512, 1), (128, 4), (1024, 1))  # (prompt tokens, requests) timed alone and beside a neighbour
NEIGHBOUR_STREAMS, NEIGHBOUR_PROMPT_TOKENS = 4, 256
CO_RUN_PAIRS = 3  # alone, then beside the neighbour, in turn


@dataclass(frozen=True)
class Profile:
    samples: list[StepSample]
    idle_penalty: tuple[tuple[float, float], ...]  # (gap seconds, extra seconds) points
    worker_hop_s: float
    worker_idle_penalty: tuple[tuple[float, float], ...]  # the same, through a worker process
    co_run_slowdown: dict[str, float]  # per step kind: seconds beside a busy neighbour over seconds alone


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="small", help="built-in model name, GGUF file or checkpoint dir")
    p.add_argument("--out", type=Path, required=True, help="calibration file to write (JSON)")
    p.add_argument("--max-tokens", type=int, default=8, help="reply length of each profiled request")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from agents_eval.report import machine_info
    from engine.config import EngineSettings

    measured = profile_engine(args.model, args.max_tokens, args.seed)
    calibration = fit(args.model, EngineSettings().dtype, measured.samples, machine_info(), measured.idle_penalty,
                      measured.worker_hop_s, measured.worker_idle_penalty, measured.co_run_slowdown)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    calibration.save(args.out)
    print(f"{len(measured.samples)} steps; coefficients {calibration.coefficients}; decode batch factors "
          f"{calibration.decode_batch_factors}; idle penalty {measured.idle_penalty}; worker hop "
          f"{1000 * measured.worker_hop_s:.2f} ms, its idle penalty {measured.worker_idle_penalty}; co-run slowdown "
          f"{measured.co_run_slowdown}; wrote {args.out}")


def profile_engine(model: str, max_tokens: int, seed: int) -> Profile:
    from engine.config import EngineSettings
    from engine.core.llm_engine import LLMEngine

    # one thread, as each worker of the disaggregated engine has (configs/deployment.yaml threads_per_worker);
    # random prompts share no prefix, so the cache hits only where a turn reuses its history
    engine = LLMEngine(model, EngineSettings(num_threads=1))
    rng, samples = random.Random(seed), []
    for length in PROMPT_LENGTHS:
        for size in BATCH_SIZES:
            samples += _round(engine, [_tokens(engine, rng, length) for _ in range(size)], max_tokens)
    for prefix in CACHED_PREFIXES:
        for delta in TURN_DELTAS:
            for size in TURN_BATCHES:
                histories = [_tokens(engine, rng, prefix) for _ in range(size)]
                samples += _round(engine, histories, max_tokens)
                samples += _round(engine, [h + _tokens(engine, rng, delta) for h in histories], max_tokens)
            for decoders in DECODERS:
                samples += _joining_round(engine, rng, prefix, delta, decoders, max_tokens)
    penalty = idle_penalty(engine, rng, max_tokens)
    slowdown = co_run_slowdown(model, engine, rng, max_tokens)
    hop_s, worker_penalty = worker_process(model, engine, rng)
    return Profile(samples, penalty, hop_s, worker_penalty, slowdown)


def _joining_round(engine: LLMEngine, rng: random.Random, prefix: int, delta: int, decoders: int,
                   max_tokens: int) -> list[StepSample]:
    """A cached-prefix turn added once `decoders` requests of `prefix` tokens are past their prefill."""
    history = _tokens(engine, rng, prefix)
    samples = _round(engine, [history], max_tokens)
    for _ in range(decoders):
        engine.add_request(_tokens(engine, rng, prefix), _params(4 * max_tokens))
    samples += _drain(engine, until=lambda: not engine.scheduler.waiting and all(
        s.num_computed_tokens >= s.num_prompt_tokens for s in engine.scheduler.running))
    engine.add_request(history + _tokens(engine, rng, delta), _params(max_tokens))
    return samples + _drain(engine)


def idle_penalty(engine: LLMEngine, rng: random.Random, max_tokens: int) -> tuple[tuple[float, float], ...]:
    """Per gap: the median first step of a cached-prefix turn after that gap, less the median back to back."""
    def first_step(gap_s: float) -> float:
        prefix, delta = IDLE_TURN
        history = _tokens(engine, rng, prefix)
        _round(engine, [history], max_tokens)
        time.sleep(gap_s)
        return _round(engine, [history + _tokens(engine, rng, delta)], max_tokens)[0].seconds

    back_to_back = statistics.median(first_step(0.0) for _ in range(IDLE_REPEATS))
    return tuple((gap, max(0.0, statistics.median(first_step(gap) for _ in range(IDLE_REPEATS)) - back_to_back))
                 for gap in IDLE_GAPS_S)


def co_run_slowdown(model: str, engine: LLMEngine, rng: random.Random, max_tokens: int) -> dict[str, float]:
    """Per step kind, the median over CO_RUN_PAIRS of the CO_RUN_ROUNDS' steps beside a neighbour process
    decoding over the same steps alone (the rounds run the same shapes each time, so their steps pair up). Alone
    and beside alternate, the neighbour paused between: one pair of each put the host's drift between them on
    the factor (1.03 for decode steps in one profile, 1.36 in another)."""
    import multiprocessing as mp

    def rounds() -> list[StepSample]:
        return [s for length, size in CO_RUN_ROUNDS
                for s in _round(engine, [_tokens(engine, rng, length) for _ in range(size)], max_tokens)]

    rounds()  # warm
    context = mp.get_context("spawn")
    running, decoding, stop = context.Event(), context.Event(), context.Event()
    neighbour = context.Process(target=_decode_while, args=(model, running, decoding, stop), daemon=True)
    neighbour.start()
    ratios: dict[str, list[float]] = {}
    try:
        for _ in range(CO_RUN_PAIRS):
            alone = rounds()
            running.set()
            if not decoding.wait(120):
                raise RuntimeError("the co-run neighbour did not start decoding within 120 s")
            beside = rounds()
            running.clear()
            while decoding.is_set() and neighbour.is_alive():  # it finishes its step, then waits
                time.sleep(0.01)
            for name, ratio in _ratios_by_kind(alone, beside).items():
                ratios.setdefault(name, []).append(ratio)
    finally:
        stop.set()
        running.set()
        neighbour.join(30)
    return {name: statistics.median(values) for name, values in ratios.items()}


def _ratios_by_kind(alone: list[StepSample], beside: list[StepSample]) -> dict[str, float]:
    totals: dict[str, list[float]] = {}
    for lone, paired in zip(alone, beside, strict=True):
        sums = totals.setdefault(kind(lone.work), [0.0, 0.0])
        sums[0], sums[1] = sums[0] + lone.seconds, sums[1] + paired.seconds
    return {name: beside_s / alone_s for name, (alone_s, beside_s) in totals.items()}


def _decode_while(model: str, running: Any, decoding: Any, stop: Any) -> None:
    """The neighbour: one engine (one thread) decoding NEIGHBOUR_STREAMS long replies while `running` is set
    (`decoding` set once they are past their prefill, cleared when it pauses), until `stop`."""
    from engine.config import EngineSettings
    from engine.core.llm_engine import LLMEngine

    engine, rng = LLMEngine(model, EngineSettings(num_threads=1)), random.Random(1)
    while not stop.is_set():
        if not running.is_set():
            decoding.clear()
            running.wait(0.1)
            continue
        while len(engine.scheduler.running) + len(engine.scheduler.waiting) < NEIGHBOUR_STREAMS:
            engine.add_request(_tokens(engine, rng, NEIGHBOUR_PROMPT_TOKENS), _params(256))
        engine.step()
        if not decoding.is_set() and all(s.num_computed_tokens >= s.num_prompt_tokens
                                         for s in engine.scheduler.running):
            decoding.set()


def worker_process(model: str, in_process_engine: LLMEngine, rng: random.Random
                   ) -> tuple[float, tuple[tuple[float, float], ...]]:
    """Through a worker process (the colocated engine process): the hop, the median over `HOP_PAIRS` pairs of
    the idle turn's TTFT through the process less the same turn's in process, the two taken in turn (the order
    alternating) so the host's drift falls on both; and the worker process's own idle penalty, its TTFT after
    each gap less its median back to back (a worker process waking from its wait pays more than the
    in-process engine's step does). Two medians taken a minute apart put the host's drift between them into
    the hop."""
    from engine.config import EngineSettings
    from engine.workers.coordinator.worker_engine import colocated_engine

    engine = colocated_engine(model, EngineSettings(num_threads=1))
    step = through_processes(engine)
    engines = {"in process": (in_process_engine, in_process(in_process_engine)), "worker": (engine, step)}
    try:
        _ttft(engine, step, rng, 0.0)  # its first passes, untimed
        ttfts: dict[str, list[float]] = {"in process": [], "worker": []}
        for pair in range(HOP_PAIRS):
            for name in sorted(engines, reverse=pair % 2 == 1):
                ttfts[name].append(_ttft(*engines[name], rng, 0.0))
        back_to_back = ttfts["worker"]
        hops = [through - local for through, local in zip(back_to_back, ttfts["in process"], strict=True)]
        idle = statistics.median(back_to_back)
        penalty = tuple((gap, max(0.0, statistics.median(_ttft(engine, step, rng, gap) for _ in range(IDLE_REPEATS))
                                  - idle)) for gap in IDLE_GAPS_S)
    finally:
        engine.shutdown()
    return max(0.0, statistics.median(hops)), penalty


def _ttft(engine: Any, step: Step, rng: random.Random, gap_s: float) -> float:
    """The TTFT of the idle turn (a delta on a history the engine just computed) after `gap_s` idle."""
    prefix, delta = IDLE_TURN
    history = _tokens(engine, rng, prefix)
    engine.add_request(history, _params(1))
    while engine.has_unfinished():
        step(POLL_S)
    time.sleep(gap_s)
    started = time.perf_counter()
    engine.add_request(history + _tokens(engine, rng, delta), _params(1))
    while not any(out.new_token_ids for out in step(POLL_S)):
        pass
    ttft = time.perf_counter() - started
    while engine.has_unfinished():
        step(POLL_S)
    return ttft


def _tokens(engine: Any, rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(3, engine.config.vocab_size) for _ in range(count)]


def _round(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[StepSample]:
    for prompt in prompts:
        engine.add_request(prompt, _params(max_tokens))
    return _drain(engine)


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _drain(engine: LLMEngine, until: Callable[[], bool] | None = None) -> list[StepSample]:
    """Step until every request is done (or `until` holds); one sample per step, its composition taken from the
    scheduled batch."""
    samples, schedule = [], engine.scheduler.schedule
    seen: list[StepWork] = []

    def recording(now: float = 0.0) -> ScheduledBatch:
        batch = schedule(now)
        seen.append(StepWork.of(batch.composition()))
        return batch

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    try:
        while engine.has_unfinished() and not (until and until()):
            started = time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - started
            if seen and seen[-1].tokens:
                samples.append(StepSample(seen[-1], seconds))
    finally:
        del engine.scheduler.schedule
    return samples
