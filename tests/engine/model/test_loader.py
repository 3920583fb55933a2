"""engine.model.loader: built-in random-weight models, checkpoint quirks, and one-line errors."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.loader import ModelLoadError, builtin_model_names, load_model

WEIGHTS = "model.safetensors"


def edited_copy(source: Path, target: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    shutil.copytree(source, target)
    tensors = load_file(target / WEIGHTS)
    edit(tensors)
    save_file(tensors, target / WEIGHTS, metadata={"format": "pt"})
    return target


def load_error(name_or_path: str | Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(str(name_or_path))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_builtin_names() -> None:
    assert {"tiny", "small"} <= set(builtin_model_names())


def test_tiny_weights_are_deterministic() -> None:
    first, second = load_model("tiny"), load_model("tiny")
    assert first.checkpoint is None
    assert first.config.vocab_size == 4096 and first.config.eos_token_ids == (2,)
    one, two = first.model.state_dict(), second.model.state_dict()
    assert all(torch.equal(one[name], two[name]) for name in one)
    assert not first.model.training
    assert float(one["model.layers.0.mlp.up_proj.weight"].std()) == pytest.approx(0.02, rel=0.05)


def test_small_has_15_to_50m_parameters() -> None:
    model = load_model("small").model
    assert 15e6 <= sum(p.numel() for p in model.parameters()) <= 50e6


def test_unknown_model_lists_builtin_names() -> None:
    message = load_error("no-such-model")
    assert "unknown model 'no-such-model'" in message
    assert "tiny" in message and "small" in message


def test_directory_without_config(tmp_path: Path) -> None:
    assert load_error(tmp_path) == f"no config.json in {tmp_path}"


def test_directory_without_weights(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    shutil.copy(make_hf_checkpoint() / "config.json", tmp_path)
    assert load_error(tmp_path) == f"no *.safetensors in {tmp_path}"


def test_unsupported_architecture(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    config = json.loads((make_hf_checkpoint() / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "unsupported architecture 'MistralForCausalLM'" in load_error(tmp_path)


def test_unsupported_rope_type(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    shutil.copytree(make_hf_checkpoint(), tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    assert "unsupported rope_scaling type 'yarn'" in load_error(tmp_path / "ckpt")


def test_missing_tensor_is_named(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    name = "model.layers.1.mlp.down_proj.weight"
    broken = edited_copy(make_hf_checkpoint(), tmp_path / "ckpt", lambda t: t.pop(name))
    assert load_error(broken) == f"checkpoint lacks 1 tensors, e.g. {name}"


def test_missing_lm_head_when_untied(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    broken = edited_copy(make_hf_checkpoint(), tmp_path / "ckpt", lambda t: t.pop("lm_head.weight"))
    assert "lm_head.weight" in load_error(broken)


def test_unexpected_tensor_is_named(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    def add(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)

    broken = edited_copy(make_hf_checkpoint(), tmp_path / "ckpt", add)
    message = load_error(broken)
    assert message == "checkpoint has 1 unexpected tensors, e.g. model.layers.0.mlp.extra.weight"


def test_wrong_shape_is_named(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    def shrink(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.norm.weight"] = torch.ones(3)

    broken = edited_copy(make_hf_checkpoint(), tmp_path / "ckpt", shrink)
    assert load_error(broken) == "tensor model.norm.weight has shape (3,), expected (64,)"


def test_rotary_buffers_and_tied_lm_head_are_ignored(tmp_path: Path,
                                                    make_hf_checkpoint: Callable[..., Path]) -> None:
    def add(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()

    source = make_hf_checkpoint(tie=True)
    loaded = load_model(str(edited_copy(source, tmp_path / "ckpt", add)))
    assert loaded.config.tie_word_embeddings
    assert loaded.model.lm_head is None
    assert "lm_head.weight" not in loaded.model.state_dict()


def test_missing_shard_is_reported(tmp_path: Path, make_hf_checkpoint: Callable[..., Path]) -> None:
    broken = shutil.copytree(make_hf_checkpoint(max_shard_size="100KB"), tmp_path / "ckpt")
    shard = sorted(broken.glob("*.safetensors"))[0]
    shard.unlink()
    assert load_error(broken).startswith(f"cannot read {shard}")
