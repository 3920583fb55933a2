"""The default model, SmolLM2-135M-Instruct from its GGUF file, against transformers loading the same file:
logits at prefill and 32 decode steps on 8 batched chat prompts, and greedy ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.loader import builtin_gguf
from tests.engine.model.test_engine_parity import STEPS, check_against_hf, hf_greedy

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "List three prime numbers.", "Write a haiku about the sea.",
             "Explain what a Python traceback is.", "ls -la\ntotal 8\ndrwxr-xr-x 2 root root 4096 .\nWhich files?",
             '{"status": "error", "code": 404}\nWhat went wrong?', "Hi", "Translate 'good morning' to Spanish."]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return builtin_gguf("smollm2")


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                             dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def chat_prompts(gguf_path: Path) -> list[list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in QUESTIONS]


def test_batched_logits_and_greedy_ids_equal_transformers(reference: torch.nn.Module,
                                                          chat_prompts: list[list[int]]) -> None:
    exact = EngineSettings(max_num_batched_tokens=128, num_kv_blocks=512, gguf_weights="dequantize")  # the parity
    engine = LLMEngine("smollm2", exact)
    assert engine.config.num_hidden_layers == 30 and engine.config.vocab_size == 49152
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, return_logits=True)
    results = engine.generate(chat_prompts, params)
    check_against_hf(results, chat_prompts, reference)
    assert results[0].token_ids == hf_greedy(reference, chat_prompts[0])


def test_the_default_model_knows_the_capital_of_france(chat_prompts: list[list[int]]) -> None:
    engine = LLMEngine("smollm2", EngineSettings(num_kv_blocks=64))
    [result] = engine.generate([chat_prompts[0]], SamplingParams(temperature=0, max_tokens=16))
    assert "Paris" in result.text
