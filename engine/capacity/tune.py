"""`agentserve tune`: the decode concurrency and prefill batch size a model affords on one GPU.

- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes (GQA counted).
- Weights = parameters x dtype bytes; parameters from the config's shape: embeddings, attention with GQA
  (plus q/k/v biases where the architecture has them), the SwiGLU MLP, the norms, the lm head unless tied.
- Activation reserve = the peak of one prefill step, one layer live at a time: per token the residual and
  its normed copy (2 x hidden) and the MLP's gate, up and their product (3 x intermediate) in the model
  dtype, plus the float32 logits of each sequence's last token.
- Decode concurrency = floor((gpu_mem x utilization - weights - reserve) / (KV bytes per token x seq_len)):
  sequences whose whole context fits in the KV cache at once.
- Prefill batch: a step of about `--prefill-tokens` tokens (2048 by default) keeps a GPU's matrix units
  busy; past that, prefill time grows linearly and only delays the decode steps sharing the GPU. The batch is
  that many tokens divided by seq_len (at least one sequence, chunked when longer), and no more sequences
  than the KV cache holds.

Beside it, the seed's plain formula: bytes per token = 2 x hidden_size x layers x 2 bytes (no GQA, fp16
assumed), over the same memory budget.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine.config import ModelConfig
from engine.core.validation import read_model_config

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
DEFAULT_DTYPE = "bfloat16"
DEFAULT_UTILIZATION = 0.9
PREFILL_TARGET_TOKENS = 2048
SEED_DTYPE_BYTES = 2
LOGIT_BYTES = 4


def parse_size(text: str) -> int:
    """Bytes in `80GiB`, `80GB`, `500MiB`, `1.5 TiB` or a plain byte count."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in SIZE_UNITS:
        raise ValueError(f"cannot read the size {text!r}: use a number with a unit like 80GiB, 80GB or 500MiB")
    size = int(Decimal(match.group(1)) * SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"the size {text!r} must be more than 0 bytes")
    return size


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def parameter_count(config: ModelConfig) -> int:
    hidden, head_dim = config.hidden_size, config.head_dim
    q_width, kv_width = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
    if config.attention_bias:
        attention += q_width + 2 * kv_width
    mlp = 3 * hidden * config.intermediate_size
    layer = attention + mlp + 2 * hidden  # two RMSNorms
    embeddings = config.vocab_size * hidden
    lm_head = 0 if config.tie_word_embeddings else config.vocab_size * hidden
    return embeddings + config.num_hidden_layers * layer + hidden + lm_head


def kv_bytes_per_token(config: ModelConfig, element_bytes: int) -> int:
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element_bytes


def seed_kv_bytes_per_token(config: ModelConfig) -> int:
    return 2 * config.hidden_size * config.num_hidden_layers * SEED_DTYPE_BYTES


def activation_reserve(config: ModelConfig, tokens: int, sequences: int, element_bytes: int) -> int:
    per_token = (2 * config.hidden_size + 3 * config.intermediate_size) * element_bytes
    return tokens * per_token + sequences * config.vocab_size * LOGIT_BYTES


@dataclass(frozen=True)
class TuneResult:
    model: str
    dtype: str
    gpu_mem_bytes: int
    utilization: float
    seq_len: int
    parameters: int
    weights_bytes: int
    kv_bytes_per_token: int
    activation_reserve_bytes: int
    kv_budget_bytes: int
    decode_concurrency: int
    prefill_batch_size: int  # sequences per prefill step
    prefill_tokens_per_step: int
    seed_kv_bytes_per_token: int
    seed_decode_concurrency: int


def tune(config: ModelConfig, model: str, gpu_mem_bytes: int, seq_len: int | None = None,
         dtype: str = DEFAULT_DTYPE, utilization: float = DEFAULT_UTILIZATION,
         prefill_target_tokens: int = PREFILL_TARGET_TOKENS) -> TuneResult:
    seq_len = seq_len or config.max_position_embeddings
    _check_inputs(config, seq_len, utilization, prefill_target_tokens)
    element = dtype_bytes(dtype)
    weights = parameter_count(config) * element
    sequences = max(1, prefill_target_tokens // seq_len)
    reserve = activation_reserve(config, min(prefill_target_tokens, sequences * seq_len), sequences, element)
    budget = int(Decimal(gpu_mem_bytes) * Decimal(str(utilization))) - weights - reserve
    per_token = kv_bytes_per_token(config, element)
    concurrency = max(0, budget) // (per_token * seq_len)
    if concurrency < 1:
        raise ValueError(f"{model} does not fit: {_human(gpu_mem_bytes)} x {utilization} leaves "
                         f"{_human(max(0, budget))} after weights and activations, one {seq_len}-token sequence "
                         f"needs {_human(per_token * seq_len)}")
    batch = min(sequences, concurrency)
    return TuneResult(model, dtype, gpu_mem_bytes, utilization, seq_len, parameter_count(config), weights,
                      per_token, reserve, budget, concurrency, batch, min(prefill_target_tokens, batch * seq_len),
                      seed_kv_bytes_per_token(config), budget // (seed_kv_bytes_per_token(config) * seq_len))


def _check_inputs(config: ModelConfig, seq_len: int, utilization: float, prefill_target_tokens: int) -> None:
    if not 0 < seq_len <= config.max_position_embeddings:
        raise ValueError(f"--seq-len must be between 1 and the model's context of "
                         f"{config.max_position_embeddings} tokens, got {seq_len}")
    if not 0 < utilization <= 1:
        raise ValueError(f"--gpu-utilization must be in (0, 1], got {utilization}")
    if prefill_target_tokens < 1:
        raise ValueError(f"--prefill-tokens must be at least 1, got {prefill_target_tokens}")


def checkpoint_dtype(directory: Path | None) -> str | None:
    """The dtype a checkpoint's config.json names (`torch_dtype`, or `dtype` in newer files)."""
    if directory is None:
        return None
    config = json.loads((directory / "config.json").read_text())
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if isinstance(dtype, str) else None


def _human(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


def _table(result: TuneResult, config: ModelConfig) -> Table:
    element = dtype_bytes(result.dtype)
    kv_shape = (f"2 x {config.num_hidden_layers} layers x {config.num_key_value_heads} KV heads x "
                f"{config.head_dim} head dim x {element} B")
    rows = [
        ("parameters", f"{result.parameters:,}", f"{config.num_hidden_layers} layers, hidden {config.hidden_size}"),
        ("weights", _human(result.weights_bytes), f"parameters x {element} B ({result.dtype})"),
        ("KV bytes per token", f"{result.kv_bytes_per_token:,} B", kv_shape),
        ("KV per sequence", _human(result.kv_bytes_per_token * result.seq_len), f"x {result.seq_len} tokens"),
        ("activation reserve", _human(result.activation_reserve_bytes), "one prefill step, one layer live"),
        ("KV budget", _human(result.kv_budget_bytes),
         f"{_human(result.gpu_mem_bytes)} x {result.utilization} - weights - reserve"),
        ("decode concurrency", str(result.decode_concurrency), "KV budget / KV per sequence"),
        ("prefill batch size", str(result.prefill_batch_size),
         f"sequences per step, {result.prefill_tokens_per_step} tokens per step"),
        ("seed: KV bytes per token", f"{result.seed_kv_bytes_per_token:,} B",
         f"2 x hidden {config.hidden_size} x {config.num_hidden_layers} layers x 2 B (no GQA, no dtype)"),
        ("seed: decode concurrency", str(result.seed_decode_concurrency), "same budget, seed's bytes per token"),
    ]
    table = Table(title=f"agentserve tune: {result.model}")
    for column in ("quantity", "value", "how"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="built-in model name or Hugging Face checkpoint dir")
    parser.add_argument("--gpu-mem", required=True, help="GPU memory, e.g. 80GiB, 80GB, 500MiB")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's context)")
    parser.add_argument("--dtype", help=f"weights and KV dtype (default: the checkpoint's, else {DEFAULT_DTYPE})")
    parser.add_argument("--gpu-utilization", type=float, default=DEFAULT_UTILIZATION,
                        help="share of GPU memory to use")
    parser.add_argument("--prefill-tokens", type=int, default=PREFILL_TARGET_TOKENS,
                        help="tokens per prefill step that saturate the GPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    config, directory = read_model_config(args.model)
    dtype = args.dtype or checkpoint_dtype(directory) or DEFAULT_DTYPE
    result = tune(config, args.model, parse_size(args.gpu_mem), args.seq_len, dtype, args.gpu_utilization,
                  args.prefill_tokens)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        Console(width=160).print(_table(result, config))


def register(sub: argparse._SubParsersAction) -> None:
    add_arguments(sub.add_parser("tune", help="decode concurrency and prefill batch size for a model on a GPU"))
