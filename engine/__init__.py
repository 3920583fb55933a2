"""agentserve's engine: token ids in, token ids out. The gateway and trajectory import what they use of it from
here; each name's module is imported when the name is first used, so `import engine.core.slo` (or any policy
module the simulator runs) still loads no torch.

core/ (engine loop, scheduler, queue policy, sampling incl. structured outputs), kv_cache/ (manager, block pool,
pins, tiers, wire format), model/ (model, attention, loader, runner, tokenizers, gguf), workers/ (coordinator and
worker sides), transport/, capacity/ (controller).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.capacity.events import JsonValue
    from engine.capacity.loop import CapacityLoop
    from engine.capacity.settings import CapacitySettings
    from engine.capacity.signals import ROLES, AdmittedWork, LoadSnapshot, Shift, WorkerLoad
    from engine.config import EngineSettings, YamlSettings
    from engine.core.async_engine import AsyncLLMEngine, EngineDeadError, ServingEngine
    from engine.core.ids import fresh_id
    from engine.core.llm_engine import LLMEngine
    from engine.core.output import RequestOutput
    from engine.core.sampling.defaults import SamplingDefaults, model_sampling_defaults
    from engine.core.sampling.grammar import JSON_OPTIONS, GrammarError, check_grammar
    from engine.core.sampling.grammar_spec import GrammarCounters, GrammarSpec
    from engine.core.sampling.sampler import RequestError, SamplingParams, TokenLogprob
    from engine.core.sequence import SessionRef
    from engine.core.slo import load_slo_config
    from engine.core.stats import AgentSignals, EngineStats, WorkerReport
    from engine.core.validation import Prompt, RequestValidator, load_tokenizer_or_none
    from engine.gc_heap import freeze_startup_heap
    from engine.model.gguf import is_gguf_path
    from engine.model.gguf.tokenizer import read_gguf_chat_template, read_gguf_vocab
    from engine.model.loader import resolve_model
    from engine.model.mask import HistoryCounters, MaskedSpan, QuerySelection, ScoredPolicy
    from engine.model.tokenizer import Tokenizer
    from engine.workers.coordinator.worker_engine import WorkerEngine, colocated_engine

_EXPORTS = {  # name: its module
    "JsonValue": "engine.capacity.events",
    "CapacityLoop": "engine.capacity.loop",
    "CapacitySettings": "engine.capacity.settings",
    "AdmittedWork": "engine.capacity.signals",
    "LoadSnapshot": "engine.capacity.signals",
    "ROLES": "engine.capacity.signals",
    "Shift": "engine.capacity.signals",
    "WorkerLoad": "engine.capacity.signals",
    "EngineSettings": "engine.config",
    "YamlSettings": "engine.config",
    "AsyncLLMEngine": "engine.core.async_engine",
    "EngineDeadError": "engine.core.async_engine",
    "ServingEngine": "engine.core.async_engine",
    "fresh_id": "engine.core.ids",
    "LLMEngine": "engine.core.llm_engine",
    "RequestOutput": "engine.core.output",
    "SamplingDefaults": "engine.core.sampling.defaults",
    "model_sampling_defaults": "engine.core.sampling.defaults",
    "GrammarError": "engine.core.sampling.grammar",
    "JSON_OPTIONS": "engine.core.sampling.grammar",
    "check_grammar": "engine.core.sampling.grammar",
    "GrammarCounters": "engine.core.sampling.grammar_spec",
    "GrammarSpec": "engine.core.sampling.grammar_spec",
    "RequestError": "engine.core.sampling.sampler",
    "SamplingParams": "engine.core.sampling.sampler",
    "TokenLogprob": "engine.core.sampling.sampler",
    "SessionRef": "engine.core.sequence",
    "load_slo_config": "engine.core.slo",
    "AgentSignals": "engine.core.stats",
    "EngineStats": "engine.core.stats",
    "WorkerReport": "engine.core.stats",
    "Prompt": "engine.core.validation",
    "RequestValidator": "engine.core.validation",
    "load_tokenizer_or_none": "engine.core.validation",
    "freeze_startup_heap": "engine.gc_heap",
    "is_gguf_path": "engine.model.gguf",
    "read_gguf_chat_template": "engine.model.gguf.tokenizer",
    "read_gguf_vocab": "engine.model.gguf.tokenizer",
    "resolve_model": "engine.model.loader",
    "HistoryCounters": "engine.model.mask",
    "MaskedSpan": "engine.model.mask",
    "QuerySelection": "engine.model.mask",
    "ScoredPolicy": "engine.model.mask",
    "Tokenizer": "engine.model.tokenizer",
    "WorkerEngine": "engine.workers.coordinator.worker_engine",
    "colocated_engine": "engine.workers.coordinator.worker_engine",
}
__all__ = [
    "JSON_OPTIONS",
    "ROLES",
    "AdmittedWork",
    "AgentSignals",
    "AsyncLLMEngine",
    "CapacityLoop",
    "CapacitySettings",
    "EngineDeadError",
    "EngineSettings",
    "EngineStats",
    "GrammarCounters",
    "GrammarError",
    "GrammarSpec",
    "HistoryCounters",
    "JsonValue",
    "LLMEngine",
    "LoadSnapshot",
    "MaskedSpan",
    "Prompt",
    "QuerySelection",
    "RequestError",
    "RequestOutput",
    "RequestValidator",
    "SamplingDefaults",
    "SamplingParams",
    "ScoredPolicy",
    "ServingEngine",
    "SessionRef",
    "Shift",
    "TokenLogprob",
    "Tokenizer",
    "WorkerEngine",
    "WorkerLoad",
    "WorkerReport",
    "YamlSettings",
    "check_grammar",
    "colocated_engine",
    "freeze_startup_heap",
    "fresh_id",
    "is_gguf_path",
    "load_slo_config",
    "load_tokenizer_or_none",
    "model_sampling_defaults",
    "read_gguf_chat_template",
    "read_gguf_vocab",
    "resolve_model",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
