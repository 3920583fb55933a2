"""Step time from the model's shape and the device: FLOPs and bytes of one engine step.

A step computes `tokens` new tokens over `seqs` sequences. FLOPs: 2 x active parameters per token (an MoE's
router and its top-k experts, not all of them), the LM head for each sampled token, and attention: 4 x layers
x query width per (query, key) pair, a prefill chunk of q tokens after c cached ones having q*c + q(q+1)/2
pairs. Bytes: the weights read once per step (attention, dense MLP, LM head, and for an MoE the experts the
step's tokens touch: E x (1 - (1 - k/E)^tokens) per layer in expectation under uniform routing), the KV read
for every sequence's context and written for its new tokens. A device spends max(FLOPs / (peak x efficiency),
bytes / (bandwidth x efficiency)) split over its tensor-parallel group (a roofline), plus the step overhead
and two ring all-reduces of the activations per layer over the group's interconnect.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from agents_eval.sim.model.specs import DeviceSpec, ModelShape


@dataclass(frozen=True)
class StepWork:
    seqs: int = 0
    tokens: int = 0  # new tokens computed (prefill chunks and decodes)
    sampled: int = 0  # tokens sampled (LM head rows)
    attention_pairs: int = 0  # (query, key) position pairs over all sequences
    context_tokens: int = 0  # KV read: tokens cached before the step, over all sequences

    @property
    def decodes_only(self) -> bool:
        """One new token per sequence: no prompt chunk in the step."""
        return self.tokens == self.seqs

    @classmethod
    def of(cls, items: Iterable[tuple[int, int, bool]]) -> StepWork:
        """items: (new tokens, tokens already in KV, samples a token) per sequence in the batch."""
        seqs = tokens = sampled = pairs = context = 0
        for new, cached, samples in items:
            seqs += 1
            tokens += new
            sampled += samples
            pairs += new * cached + new * (new + 1) // 2
            context += cached
        return cls(seqs, tokens, sampled, pairs, context)


def linear_flops(shape: ModelShape, work: StepWork) -> float:
    """The weights' matmuls: the active parameters for every new token, the LM head for every sampled one."""
    return 2.0 * shape.active_params * work.tokens + 2.0 * shape.vocab * shape.hidden * work.sampled


def attention_flops(shape: ModelShape, work: StepWork) -> float:
    return 4.0 * shape.layers * shape.q_width * work.attention_pairs


def step_flops(shape: ModelShape, work: StepWork) -> float:
    return linear_flops(shape, work) + attention_flops(shape, work)


def experts_touched(shape: ModelShape, tokens: int) -> float:
    """Expected distinct experts per layer that `tokens` tokens route to (uniform top-k routing)."""
    if not shape.num_experts or not tokens:
        return 0.0
    return shape.num_experts * (1.0 - (1.0 - shape.experts_per_token / shape.num_experts) ** tokens)


def step_bytes(shape: ModelShape, work: StepWork) -> float:
    per_layer = shape.attention_params + shape.dense_mlp_params + shape.router_params
    weights = shape.layers * (per_layer + experts_touched(shape, work.tokens) * shape.expert_params)
    weights += shape.vocab * shape.hidden if work.sampled else 0
    kv = (work.context_tokens + work.tokens) * shape.kv_bytes_per_token
    return weights * shape.dtype_bytes + kv


class StepTimer(Protocol):
    def step_time(self, work: StepWork) -> float: ...

    def after_idle_s(self, idle_s: float) -> float:
        """Extra seconds of a worker's first step after `idle_s` seconds without work."""

    def co_run_factor(self, work: StepWork) -> float:
        """How much longer the step takes while another worker on the same host is mid-step."""


@dataclass(frozen=True)
class RooflineTimer:
    device: DeviceSpec
    shape: ModelShape
    tensor_parallel: int = 1

    def step_time(self, work: StepWork) -> float:
        if not work.tokens:
            return 0.0
        tp, device = self.tensor_parallel, self.device
        compute = step_flops(self.shape, work) / (tp * device.peak_flops * device.flops_efficiency)
        memory = step_bytes(self.shape, work) / (tp * device.memory_bandwidth * device.bandwidth_efficiency)
        return device.step_overhead_s + max(compute, memory) + self.all_reduce_s(work.tokens)

    def after_idle_s(self, idle_s: float) -> float:
        return 0.0  # a datasheet has no figure for it; a calibration measures it

    def co_run_factor(self, work: StepWork) -> float:
        return 1.0  # a roofline worker owns its GPUs

    def all_reduce_s(self, tokens: int) -> float:
        """Two ring all-reduces of the hidden states per layer (after attention and after the MLP)."""
        tp = self.tensor_parallel
        if tp == 1:
            return 0.0
        payload = tokens * self.shape.hidden * self.shape.dtype_bytes
        return 2 * self.shape.layers * 2 * (tp - 1) / tp * payload / self.device.interconnect_bandwidth


@dataclass(frozen=True)
class Link:
    """A network path for KV: bandwidth (bytes/s), the share of it a transport achieves, and per-transfer
    latency."""

    bandwidth: float
    efficiency: float
    latency_s: float

    def transfer_s(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / (self.bandwidth * self.efficiency)
