"""The Hugging Face `transformers` baselines of the engine benchmark, on our model's own weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import transformers
from torch import nn

from agents_eval.bench.engine.workload import BenchRequest, RunResult, Stopwatch
from engine.config import ModelConfig

Advance = Callable[[int], None]
PAD_TOKEN_ID = 0


def build_hf_model(model: nn.Module, config: ModelConfig) -> transformers.PreTrainedModel:
    """`transformers`' model of the same architecture holding a copy of `model`'s weights, fp32, eval.

    Never stops at eos, like our requests with `ignore_eos`, so both compute exactly the same tokens.
    """
    hf_config = transformers.AutoConfig.for_model(**config.to_hf_dict())
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = dict(model.state_dict())
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    result = hf_model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"weights do not transfer to transformers: missing {result.missing_keys[:3]}, "
                         f"unexpected {result.unexpected_keys[:3]}")
    hf_model.generation_config.eos_token_id = None
    return hf_model.float().eval()


def attention_implementation(hf_model: transformers.PreTrainedModel) -> str:
    return str(getattr(hf_model.config, "_attn_implementation", "unknown"))


def _generate(hf_model: transformers.PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              num_new: int) -> torch.Tensor:
    """Greedy generation of exactly `num_new` tokens per row; returns only the new tokens [B, num_new]."""
    generate = cast(Callable[..., torch.Tensor], hf_model.generate)  # typed as a module attribute
    with torch.inference_mode():
        out = generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                       max_new_tokens=num_new, min_new_tokens=num_new, pad_token_id=PAD_TOKEN_ID)
    return out[:, input_ids.shape[1]:]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_TOKEN_ID] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def warm_up(hf_model: transformers.PreTrainedModel, prompts: list[list[int]], prompt_len: int,
            num_new: int) -> None:
    ids, mask = left_pad([p[:prompt_len] for p in prompts])
    _generate(hf_model, ids, mask, num_new)


def run_sequential(hf_model: transformers.PreTrainedModel, workload: list[BenchRequest],
                   advance: Advance) -> RunResult:
    """`generate` one request at a time: the usual batch-1 baseline."""
    tokens = []
    stopwatch = Stopwatch()
    for request in workload:
        ids, mask = left_pad([request.prompt])
        tokens.append(_generate(hf_model, ids, mask, request.output_len)[0].tolist())
        advance(1)
    return RunResult("HF generate (batch 1)", *stopwatch.read(), tokens, sum(len(t) for t in tokens))


def run_batched(hf_model: transformers.PreTrainedModel, workload: list[BenchRequest], batch_size: int,
                advance: Advance) -> RunResult:
    """Left-padded batches in workload order; a batch runs to its longest output, and only each
    request's own output tokens count as useful."""
    tokens: list[list[int]] = []
    generated = 0
    stopwatch = Stopwatch()
    for first in range(0, len(workload), batch_size):
        batch = workload[first:first + batch_size]
        ids, mask = left_pad([r.prompt for r in batch])
        new = _generate(hf_model, ids, mask, max(r.output_len for r in batch))
        tokens += [row[:r.output_len].tolist() for row, r in zip(new, batch, strict=True)]
        generated += new.numel()
        advance(len(batch))
    return RunResult(f"HF generate (batches of {batch_size})", *stopwatch.read(), tokens, generated)
