from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from agentserve.cli import main
from engine.capacity.tune import kv_bytes_per_token, parameter_count, parse_size, tune
from engine.core.validation import read_model_config
from engine.model.loader import random_weights

GIB = 2**30
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "rope_theta": 500000.0}


def run_tune(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    main(["tune", *args, "--json"])
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_parameter_count_matches_the_engines_weights(model: str) -> None:
    config, _ = read_model_config(model)
    assert parameter_count(config) == sum(w.numel() for w in random_weights(config).values())


def test_small_at_80gib(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_tune(capsys, "--model", "small", "--gpu-mem", "80GiB")
    weights = 27_795_968 * 2
    reserve = 2048 * (2 * 512 + 3 * 1408) * 2 + 4096 * 4  # one 2048-token chunk, one sequence's logits
    budget = int(80 * GIB * 0.9) - weights - reserve
    assert result == {
        "model": "small", "dtype": "bfloat16", "gpu_mem_bytes": 80 * GIB, "utilization": 0.9, "seq_len": 4096,
        "parameters": 27_795_968, "weights_bytes": weights, "kv_bytes_per_token": 2 * 8 * 4 * 64 * 2,
        "activation_reserve_bytes": reserve, "kv_budget_bytes": budget, "decode_concurrency": 2301,
        "prefill_batch_size": 1, "prefill_tokens_per_step": 2048, "seed_kv_bytes_per_token": 2 * 512 * 8 * 2,
        "seed_decode_concurrency": 1150}
    assert budget // (8192 * 4096) == 2301 and budget // (16384 * 4096) == 1150


def test_tiny_with_short_sequences_batches_prefills(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_tune(capsys, "--model", "tiny", "--gpu-mem", "500MiB", "--seq-len", "256", "--dtype", "float32")
    assert (result["parameters"], result["kv_bytes_per_token"], result["seed_kv_bytes_per_token"]) == (
        598_336, 2 * 2 * 2 * 16 * 4, 2 * 64 * 2 * 2)
    reserve = 2048 * (2 * 64 + 3 * 128) * 4 + 8 * 4096 * 4
    budget = int(500 * 2**20 * 0.9) - 598_336 * 4 - reserve
    assert (result["activation_reserve_bytes"], result["kv_budget_bytes"]) == (reserve, budget)
    assert result["decode_concurrency"] == budget // (512 * 256) == 3548
    assert (result["prefill_batch_size"], result["prefill_tokens_per_step"]) == (8, 2048)


def test_llama_8b_shape_from_a_checkpoint_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    config, _ = read_model_config(str(tmp_path))
    assert kv_bytes_per_token(config, 2) == 131_072
    result = run_tune(capsys, "--model", str(tmp_path), "--gpu-mem", "80GiB", "--seq-len", "8192")
    assert result["dtype"] == "bfloat16" and result["parameters"] == 8_030_261_248
    reserve = 2048 * (2 * 4096 + 3 * 14336) * 2 + 128256 * 4
    budget = 77_309_411_328 - 8_030_261_248 * 2 - reserve
    assert (result["activation_reserve_bytes"], result["kv_budget_bytes"]) == (reserve, budget)
    assert (result["kv_bytes_per_token"], result["decode_concurrency"]) == (131_072, 56)  # 61.04e9 / 1 GiB
    assert (result["seed_kv_bytes_per_token"], result["seed_decode_concurrency"]) == (524_288, 14)


def test_tied_embeddings_and_qkv_biases_count() -> None:
    config, _ = read_model_config("tiny")
    base = parameter_count(config)
    assert parameter_count(replace(config, tie_word_embeddings=True)) == base - 4096 * 64
    assert parameter_count(replace(config, attention_bias=True)) == base + 2 * (64 + 2 * 32)


@pytest.mark.parametrize("text, size", [("80GiB", 80 * GIB), ("80GB", 80 * 10**9), ("500MiB", 500 * 2**20),
                                        ("1.5 TiB", 3 * 2**39), ("80gib", 80 * GIB), ("4096", 4096)])
def test_sizes_parse(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["80XB", "", "GiB", "-1GB", "0GB", "8 0GB"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_a_model_that_does_not_fit_is_refused() -> None:
    config, _ = read_model_config("small")
    with pytest.raises(ValueError, match="does not fit"):
        tune(config, "small", parse_size("50MiB"))
    with pytest.raises(ValueError, match="--seq-len"):
        tune(config, "small", parse_size("80GiB"), seq_len=10**6)


def test_the_table_and_bad_input_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    main(["tune", "--model", "small", "--gpu-mem", "80GiB"])
    table = capsys.readouterr().out
    concurrency = next(line for line in table.splitlines() if "decode concurrency" in line and "seed" not in line)
    assert "2301" in concurrency and "8,192 B" in table and "1150" in table
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--model", "small", "--gpu-mem", "80 gigs"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "80 gigs" in error
