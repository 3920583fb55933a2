"""OpenAI request bodies the gateway accepts. Unknown fields are ignored, as OpenAI clients expect."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.sampling import SamplingParams
from gateway.errors import APIError
from trajectory.observations import ObservationUsers, observation_users
from trajectory.template_types import Message


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_message(self) -> Message:
        role = "system" if self.role == "developer" else self.role
        return Message(role, content_text(self.content), self.tool_calls, self.tool_call_id, self.name)


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    """Text of a message's content; content parts of type text (or input_text/output_text) are joined."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(part.get("text", "")) for part in content if "text" in str(part.get("type", "text")))


def observation_rule(metadata: dict[str, str] | None) -> ObservationUsers | None:
    """The request's `metadata.observation_users` (which user messages are observations), None when unset."""
    value = (metadata or {}).get("observation_users")
    if value is None:
        return None
    try:
        return observation_users(value)
    except ValueError as error:
        raise APIError(400, str(error), param="metadata.observation_users") from error


class SamplingFields(_Body):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says (benchmarks)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None  # OpenAI's: string values; `session_id` names the session

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop strings")
        return value

    def sampling_params(self, max_tokens: int, logprobs: int | None, choice: int,
                        slo_class: str | None = None) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        seed = None if self.seed is None else self.seed + choice
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=seed, stop=stops, logprobs=logprobs,
                              ignore_eos=self.ignore_eos, slo_class=slo_class)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
