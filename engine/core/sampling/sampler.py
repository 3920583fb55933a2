"""Sampling parameters and the sampler. Every request owns a `torch.Generator` whose state can be
saved and restored, so a request moved to another process continues with the same tokens."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import torch

from engine.core.sampling.grammar_spec import GrammarSpec


class RequestError(ValueError):
    """A request the engine refuses; the message names the problem in one line."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None  # None: no top-k cut
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (after temperature); 0: none
    seed: int | None = None  # None: a random seed per request
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    return_logits: bool = False  # attach each step's logits to the outputs (parity checks, debugging)
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's and the top k alternatives'
    slo_class: str | None = None  # service class in configs/slo.yaml (queue order, deadlines); None: the default
    every_token: bool = True  # False: outputs at the first token and at the end only (a reply not streamed)
    cache_salt: str | None = None  # mixed into the first KV block's hash: prefixes are reused only under one salt
    grammar: GrammarSpec | None = None  # structured output: the tokens are constrained to this grammar

    def validate(self) -> None:
        checks = [
            (self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k is None or self.top_k >= 1, f"top_k must be >= 1, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.seed is None or -2**63 <= self.seed < 2**64, f"seed must fit 64 bits, got {self.seed}"),
            (all(self.stop), "stop strings must not be empty"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, f"logprobs must be in [0, 20], got {self.logprobs}"),
        ]
        for ok, message in checks:
            if not ok:
                raise RequestError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TokenLogprob:
    """The model's log-probability of a sampled token, and of the k most likely tokens at that step."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    logprobs = logits.float().log_softmax(-1)
    top = torch.topk(logprobs, k) if k else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
    return TokenLogprob(token_id, float(logprobs[token_id]), pairs)


class Sampler:
    """Per-request generators plus batched sampling of one token per row of logits."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def add_request(self, request_id: str, seed: int | None) -> None:
        generator = torch.Generator()
        generator.manual_seed(secrets.randbits(63) if seed is None else seed)
        self._generators[request_id] = generator

    def remove_request(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def get_state(self, request_id: str) -> torch.Tensor:
        return self._generators[request_id].get_state()

    def set_state(self, request_id: str, state: torch.Tensor) -> None:
        self._generators[request_id].set_state(state)

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[int]:
        """logits: [N, vocab] float32, row i for request_ids[i]. Greedy rows take their argmax where the logits
        are; a sampled row is drawn on the host with its request's CPU generator, so its state moves between
        workers and a seeded request draws the same on any device."""
        tokens = logits.argmax(dim=-1).tolist()
        sampled = [row for row, p in enumerate(params) if not p.greedy]
        if sampled:
            probs = _step_probabilities(logits[sampled].cpu(), [params[row] for row in sampled])
            for row, token in zip(sampled, self._draw(probs, [request_ids[row] for row in sampled]), strict=True):
                tokens[row] = token
        return tokens

    def _draw(self, probs: torch.Tensor, request_ids: list[str]) -> list[int]:
        """One token per row of probs [N, vocab], by inverse transform: one uniform from each request's generator,
        looked up in the rows' cumulative sums (one op for the step, where torch.multinomial costs some 60 us a
        row on a 4k vocabulary). In float64, so no token of zero probability is picked."""
        cdf = probs.double().cumsum(-1)
        uniforms = torch.cat([torch.rand(1, dtype=torch.float64, generator=self._generators[request_id])
                              for request_id in request_ids])
        totals = cdf[:, -1]
        below_total = torch.minimum(uniforms * totals, totals.nextafter(torch.zeros_like(totals)))
        return torch.searchsorted(cdf, below_total.unsqueeze(1), right=True).squeeze(1).tolist()


def _step_probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[N, vocab] logits to probabilities, in place: the rows with a temperature only in one op, the others
    (top-k, top-p, min-p) one by one."""
    plain = [i for i, p in enumerate(params) if _temperature_only(p)]
    if plain:
        temperatures = torch.tensor([_temperature(params[i], logits.dtype) for i in plain], dtype=logits.dtype)
        rows = logits[plain]
        logits[plain] = ((rows - rows.amax(-1, keepdim=True)) / temperatures.unsqueeze(1)).softmax(-1)
    for i, p in enumerate(params):
        if not _temperature_only(p):
            logits[i] = _probabilities(logits[i], p)
    return logits


def _temperature_only(p: SamplingParams) -> bool:
    return p.top_p >= 1.0 and p.top_k is None and p.min_p <= 0.0


def _temperature(p: SamplingParams, dtype: torch.dtype) -> float:
    """At least the dtype's smallest normal: a tiny temperature gives -inf logits, not nan."""
    return max(p.temperature, torch.finfo(dtype).tiny)


def _probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    logits = (logits - logits.max()) / _temperature(p, logits.dtype)  # shifted to <= 0
    if p.top_k is not None and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.min_p > 0.0:  # the logits are shifted so the most likely token's is 0: its probability ratio is exp(logit)
        logits = logits.masked_fill(logits < math.log(p.min_p), float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= p.top_p  # keep the first token that crosses
        drop_sorted[0] = False  # and the most likely one always (a top_p below float32's range rounds to 0)
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return logits.softmax(-1)
