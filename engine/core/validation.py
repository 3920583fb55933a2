"""What a model accepts, known without its weights: tokenization and request validation, shared by the
engine and by the disaggregated coordinator (which holds no model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineSettings, ModelConfig
from engine.core.sampling.grammar import check_grammar
from engine.core.sampling.sampler import RequestError, SamplingParams
from engine.kv_cache.sizing import size_kv_cache
from engine.model.loader import load_tokenizer, resolve_model
from engine.model.tokenizer import Tokenizer, TokenizerNotFoundError

Prompt = str | list[int]


def num_kv_blocks(config: ModelConfig, settings: EngineSettings) -> int:
    """Blocks the cache gets (engine/kv_cache/sizing.py). Not capped at what max_num_seqs running requests can
    use: the prefix cache and the sessions' pinned KV hold blocks between turns too. Capped so (64 full contexts,
    131k tokens of `tiny`), the swe agent benchmark's live sessions outgrew the pool within 16 s at 16 sessions/s,
    their evicted history was prefilled again, and TTFT ran away."""
    return size_kv_cache(config, settings).num_blocks


def read_model_config(name_or_path: str) -> tuple[ModelConfig, Path | None]:
    """A built-in model's or a checkpoint's config and checkpoint (directory or GGUF file), without weights."""
    source = resolve_model(name_or_path)
    return source.config, source.checkpoint


def load_tokenizer_or_none(checkpoint: Path | None) -> Tokenizer | None:
    """A checkpoint without tokenizer files still serves token ids (vLLM's skip_tokenizer_init)."""
    try:
        return load_tokenizer(checkpoint)
    except TokenizerNotFoundError:
        return None


@dataclass
class RequestValidator:
    config: ModelConfig
    tokenizer: Tokenizer | None
    block_size: int
    num_blocks: int
    slo_classes: frozenset[str]  # the service classes a request may name (configs/slo.yaml)

    @property
    def max_model_len(self) -> int:
        return self.config.max_position_embeddings

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer; send prompt token ids instead of text")
            return self.tokenizer.encode(prompt, add_bos=self.tokenizer.bos_token_id is not None)
        return list(prompt)

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """Token ids of a valid request; RequestError naming the problem otherwise."""
        params.validate()
        if params.grammar is not None:
            check_grammar(params.grammar)
        if params.slo_class is not None and params.slo_class not in self.slo_classes:
            raise RequestError(f"slo_class {params.slo_class!r} is not one of {sorted(self.slo_classes)}")
        if not prompt:
            raise RequestError("prompt is empty")
        token_ids = self.tokenize(prompt)
        if min(token_ids) < 0 or max(token_ids) >= self.config.vocab_size:  # builtins: 10x a generator's speed
            raise RequestError(f"prompt token ids must be in [0, {self.config.vocab_size})")
        if len(token_ids) >= self.max_model_len:
            raise RequestError(f"prompt has {len(token_ids)} tokens; the model's context is "
                               f"{self.max_model_len} tokens")
        blocks_needed = -(-(len(token_ids) + 1) // self.block_size)
        if blocks_needed > self.num_blocks:
            raise RequestError(f"prompt needs {blocks_needed} KV blocks; the cache has {self.num_blocks}")
        return token_ids
