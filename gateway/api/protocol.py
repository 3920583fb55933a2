"""OpenAI request bodies the gateway accepts. Every parameter is implemented or refused with a 400 naming it
(`unsupported_parameter`): a field these models lack is accepted only when null or, for an OpenAI parameter
agentserve does not implement, set to the value that changes nothing (`NO_OP`), as OpenAI's defaults do."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine import GrammarSpec, SamplingDefaults, SamplingParams
from gateway.errors import APIError
from trajectory.observations import ObservationUsers, observation_users
from trajectory.template.types import Message

NO_OP: dict[str, Callable[[Any], bool]] = {  # parameter -> whether a value of it changes nothing here
    "frequency_penalty": lambda value: value == 0,
    "presence_penalty": lambda value: value == 0,
    "logit_bias": lambda value: value == {},
    "store": lambda value: value is False,  # chat completions: OpenAI would keep the completion
    "service_tier": lambda value: value in ("auto", "default"),
    "modalities": lambda value: value == ["text"],
    "include": lambda value: value == [],
    "truncation": lambda value: value == "disabled",
    "reasoning": lambda value: value == {},
    "background": lambda value: value is False,
    "best_of": lambda value: value == 1,
    "suffix": lambda value: value == "",
    "repetition_penalty": lambda value: value == 1,  # vLLM's; 1: no penalty
    "repeat_penalty": lambda value: value == 1,  # llama.cpp's; 1: no penalty
    "safety_identifier": lambda value: isinstance(value, str),  # an end-user id for abuse monitoring
    "prompt_cache_key": lambda value: isinstance(value, str),  # a routing hint: sessions route by their KV anyway
    "include_obfuscation": lambda value: isinstance(value, bool),  # stream padding against size side channels
}
TEXT_PARTS = ("text", "input_text", "output_text")


class RequestBody(BaseModel):
    """A request's parameters: the declared fields, and no-op values of the others (dropped)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_no_ops(cls, data: Any) -> Any:
        """Fields this model lacks, when null or a no-op value, are dropped; the rest fail as extra inputs."""
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items()
                if key in cls.model_fields or not (value is None or NO_OP.get(key, _never)(value))}


def _never(_: Any) -> bool:
    return False


def _known_tool_choice(value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """A named function is checked against the tools later (`gateway.api.structured.output_plan`)."""
    if isinstance(value, str) and value not in ("auto", "none", "required"):
        raise PydanticCustomError("invalid_value", "tool_choice must be 'auto', 'none', 'required' or a function")
    return value


ToolChoice = Annotated[str | dict[str, Any] | None, AfterValidator(_known_tool_choice)]


class StreamOptions(RequestBody):
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a message is data: clients replay replies with extra keys

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(content, list) and not all(is_text_part(part) for part in content):
            raise PydanticCustomError("unsupported_content", "only text content parts are supported")
        return content

    def to_message(self) -> Message:
        role = "system" if self.role == "developer" else self.role
        return Message(role, content_text(self.content), self.tool_calls, self.tool_call_id, self.name)


def is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type", "text") in TEXT_PARTS and isinstance(part.get("text"), str)


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    """Text of a message's content: its text parts (text, input_text, output_text) joined."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part["text"] for part in content if is_text_part(part))


def output_budget(requested: int | None, param: str, prompt_tokens: int, max_model_len: int,
                  default: int | None) -> int:
    """The most tokens a reply may have: as requested, else `default`, else the rest of the context (as OpenAI
    and vLLM do). 400 `context_length_exceeded` when the prompt and the requested tokens do not fit."""
    room = max_model_len - prompt_tokens
    if room <= 0:
        raise APIError(400, f"the prompt has {prompt_tokens} tokens; the model's context is {max_model_len} tokens",
                       code="context_length_exceeded")
    if requested is None:
        return room if default is None else min(room, default)
    if requested > room:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                       f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} "
                       "in the completion). Please reduce the length of the prompt or completion.", param=param,
                       code="context_length_exceeded")
    return requested


def observation_rule(metadata: dict[str, str] | None) -> ObservationUsers | None:
    """The request's `metadata.observation_users` (which user messages are observations), None when unset."""
    value = (metadata or {}).get("observation_users")
    if value is None:
        return None
    try:
        return observation_users(value)
    except ValueError as error:
        raise APIError(400, str(error), param="metadata.observation_users") from error


def history_rule(metadata: dict[str, str] | None, offered: Sequence[str]) -> str | None:
    """The request's `metadata.history_policy` (which history its attention reads), None when unset; 400 when
    the deployment does not offer it (`history.policies` in configs/trajectory.yaml)."""
    value = (metadata or {}).get("history_policy")
    if value is not None and value not in offered:
        raise APIError(400, f"history policy {value!r} is not offered by this deployment; offered: "
                       f"{', '.join(offered)}", param="metadata.history_policy", code="unsupported_history_policy")
    return value


class SamplingFields(RequestBody):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    # Unset (None): the model's default (engine/core/sampling/defaults.py); OpenAI's without one
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    min_p: float | None = Field(default=None, ge=0, le=1)  # vLLM's and llama.cpp's extension
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says (benchmarks)
    stop: str | list[str] | None = None
    min_tokens: int = Field(default=0, ge=0)  # vLLM's: only with ignore_eos (the reply runs to max_tokens)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None  # OpenAI's: string values; `session_id` names the session
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: prefix reuse only within it
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (gateway.api.structured)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop strings")
        return value

    @field_validator("min_tokens")
    @classmethod
    def _min_tokens_held_by_ignore_eos(cls, value: int, info: ValidationInfo) -> int:
        """agentserve has no minimum of its own: one holds when ignore_eos runs the reply to max_tokens."""
        max_tokens = info.data.get("max_tokens")
        if value and not (info.data.get("ignore_eos") and not info.data.get("stop") and max_tokens
                          and value <= max_tokens):
            raise PydanticCustomError("unsupported_parameter", "min_tokens is supported only with ignore_eos, "
                                      "max_tokens at least as large and no stop strings")
        return value

    def sampling_params(self, defaults: SamplingDefaults, max_tokens: int, logprobs: int | None, choice: int, *,
                        slo_class: str | None = None, cache_salt: str | None = None,
                        grammar: GrammarSpec | None = None) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        seed = None if self.seed is None else self.seed + choice
        sampling = defaults.resolve(self.temperature, self.top_p, self.top_k, self.min_p)
        return SamplingParams(max_tokens=max_tokens, **sampling, seed=seed, stop=stops, logprobs=logprobs,
                              ignore_eos=self.ignore_eos, slo_class=slo_class, cache_salt=cache_salt, grammar=grammar)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool = True  # False: only the first tool call the model writes is kept
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False  # the prompt's text before the completion's

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, echo: bool, info: ValidationInfo) -> bool:
        if echo and info.data.get("logprobs") is not None:
            raise PydanticCustomError("unsupported_parameter", "echo with logprobs is not supported: agentserve "
                                      "computes no prompt logprobs")
        return echo
