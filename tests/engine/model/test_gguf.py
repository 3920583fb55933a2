"""GGUF model files: block unpacking against the `gguf` package, weights and config against transformers'
GGUF loader on small files written here (both architectures, each tensor type), quantized layers, bad files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as reference_dequantize

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.gguf.blocks import SUPPORTED_TYPES, dequantize
from engine.model.gguf.quantized import Int4Linear, Int8Linear
from engine.model.gguf.reader import GGUFTensor, read_gguf, unpermute_rows
from engine.model.loader import ModelLoadError, load_model
from tests.engine.model.gguf_files import HEADS, QUANTIZABLE, encode, permute, random_blocks, write_gguf
from tests.engine.model.test_engine_parity import STEPS, check_against_hf, prompts

MATRIX = (64, 512)


def hf_from_gguf(path: Path) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_blocks_dequantize_as_the_gguf_package(qtype: QType) -> None:
    values = np.random.default_rng(0).standard_normal(MATRIX).astype(np.float32)
    data = encode(values, qtype, seed=1)
    expected = reference_dequantize(data, qtype).reshape(MATRIX)
    assert np.array_equal(dequantize(data, qtype, MATRIX).numpy(), expected)
    if qtype in QUANTIZABLE[:3]:
        assert np.abs(expected - values).max() < 1e-2


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = np.arange(HEADS * 16 * 3, dtype=np.float32).reshape(HEADS * 16, 3)
    assert np.array_equal(unpermute_rows(permute(w, HEADS), HEADS), w)
    assert not np.array_equal(permute(w, HEADS), w)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_weights_and_config_equal_transformers_loading_the_same_file(arch: str, qtype: QType,
                                                                     tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", arch, qtype)
    loaded = load_model(str(path))
    reference = hf_from_gguf(path)
    ours, theirs = loaded.model.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    assert loaded.checkpoint == path
    assert loaded.config.architecture == arch
    assert loaded.config.attention_bias == (arch == "qwen2")
    assert (loaded.config.num_key_value_heads, loaded.config.eos_token_ids) == (2, (2,))


@pytest.mark.parametrize("arch,qtype", [("llama", QType.Q4_1), ("qwen2", QType.Q4_K)])
def test_engine_logits_and_greedy_ids_equal_transformers(arch: str, qtype: QType, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", arch, qtype, tie=True)
    exact = EngineSettings(block_size=8, num_kv_blocks=256, max_num_batched_tokens=48, gguf_weights="dequantize")
    engine = LLMEngine(str(path), exact)
    assert engine.config.tie_word_embeddings
    batch = prompts(engine.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)
    check_against_hf(engine.generate(batch, params), batch, hf_from_gguf(path))


def test_int4_layer_equals_the_dequantized_matmul() -> None:
    values = np.random.default_rng(0).standard_normal(MATRIX).astype(np.float32)
    for qtype in (QType.Q4_0, QType.Q4_1, QType.Q4_K):
        data = encode(values, qtype, seed=2) if qtype != QType.Q4_K else random_blocks(MATRIX, qtype, 2, 0.05)
        tensor = GGUFTensor("w", qtype, MATRIX, data)
        bias = torch.randn(MATRIX[0])
        x = torch.randn(3, 5, MATRIX[1])
        expected = torch.nn.functional.linear(x.bfloat16().float(), tensor.dequantize(), bias)
        out = Int4Linear([tensor], bias)(x)
        assert out.shape == (3, 5, MATRIX[0]) and out.dtype == torch.float32
        torch.testing.assert_close(out, expected, atol=0.05 * expected.abs().max().item(), rtol=0.02)


def test_int8_layer_is_within_half_a_step_per_row() -> None:
    weight = torch.randn(MATRIX)
    x = torch.randn(4, MATRIX[1])
    out = Int8Linear(weight, None)(x)
    step = weight.abs().amax(dim=1) / 127
    bound = (x.abs().sum(dim=1, keepdim=True) * step / 2) + 0.02 * (x @ weight.t()).abs()
    assert ((out - x @ weight.t()).abs() <= bound).all()


def test_quantized_model_follows_the_dequantized_one(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", "llama", QType.Q4_1, tie=True)
    exact = load_model(str(path)).model
    quantized = load_model(str(path), gguf_weights="quantized").model
    layer, config = quantized.model.layers[0], exact.config
    assert isinstance(layer.mlp.gate_up_proj, Int4Linear) and isinstance(layer.self_attn.qkv_proj, Int4Linear)
    assert layer.mlp.gate_up_proj.out_features == 2 * config.intermediate_size
    assert layer.self_attn.qkv_proj.out_features == (config.num_attention_heads + 2 * config.num_key_value_heads) \
        * config.head_dim
    assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "up_proj")
    assert isinstance(quantized.lm_head, Int4Linear)
    hidden = torch.randn(6, exact.config.hidden_size)
    logits, reference = quantized.compute_logits(hidden), exact.compute_logits(hidden)
    assert (logits - reference).abs().max() < 0.05 * reference.abs().max()
    with pytest.raises(ModelLoadError, match="CPU"):
        load_model(str(path), device="meta", gguf_weights="quantized")


@pytest.mark.parametrize(("arch", "qtype"), [("llama", QType.Q8_0), ("qwen2", QType.Q4_1)])
def test_quantized_engine_generates_like_the_exact_one(arch: str, qtype: QType, tmp_path: Path) -> None:
    """Teacher-forced: at every step of the exact engine's greedy continuation, the quantized engine, given the
    same context, picks the same next token (on random weights the logits are nearly flat, so a lossy int8
    requantization flips a few argmaxes; free-running, one flip would change every later token)."""
    path = write_gguf(tmp_path / "model.gguf", arch, qtype)  # qwen2: fused q/k/v with their biases
    batch, steps = prompts(320)[:4], 8
    settings = dict(block_size=8, num_kv_blocks=256)
    exact = LLMEngine(str(path), EngineSettings(**settings, gguf_weights="dequantize")).generate(
        batch, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    contexts = [prompt + done.token_ids[:step] for prompt, done in zip(batch, exact, strict=True)
                for step in range(steps)]
    wanted = [token for done in exact for token in done.token_ids]
    quick = LLMEngine(str(path), EngineSettings(**settings, gguf_weights="quantized")).generate(
        contexts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    agreeing = sum(done.token_ids == [token] for done, token in zip(quick, wanted, strict=True))
    assert agreeing >= 0.9 * len(wanted)
    assert all(quick[steps * index].token_ids == done.token_ids[:1] for index, done in enumerate(exact))  # first tokens


def test_tensors_keep_their_types_and_torch_shapes(tmp_path: Path) -> None:
    model = read_gguf(write_gguf(tmp_path / "m.gguf", "qwen2", QType.Q8_0))
    up = model.tensors["model.layers.0.mlp.up_proj.weight"]
    assert (up.qtype, up.shape) == (QType.Q8_0, (512, 256))
    assert model.tensors["model.layers.1.self_attn.k_proj.bias"].qtype == QType.F32


def load_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_file(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "not a readable GGUF file" in load_error(path)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 certainly not gguf" * 10)
    assert "not a readable GGUF file" in load_error(path)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", architecture_name="falcon")
    assert "unsupported architecture 'falcon'" in load_error(path)


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", qtype=QType.Q5_0)
    message = load_error(path)
    assert "unsupported type Q5_0" in message and "Q4_1" in message


def test_cli_exits_2_with_one_line_on_a_bad_file(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", architecture_name="falcon")
    result = subprocess.run([sys.executable, "-m", "agentserve", "generate", "--model", str(path),
                             "--prompt-ids", "1,2,3"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unsupported architecture" in result.stderr
