"""A model's sampling defaults fill what a request leaves unset; what a request sets is used as set (OpenAI's
semantics); min_p reaches the engine from chat completions, completions and Responses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.defaults import SamplingDefaults, model_sampling_defaults
from gateway.api.protocol import ChatCompletionRequest
from gateway.settings import GatewaySettings
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import running_gateway, serving
from tests.gateway.upstream.test_protocol import Fake

SMOLLM2_CARD = SamplingDefaults(temperature=0.2, top_p=0.9)
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_built_in_model_has_its_cards_defaults_and_others_openais() -> None:
    assert model_sampling_defaults("smollm2") == SMOLLM2_CARD
    assert model_sampling_defaults("tiny") == SamplingDefaults(temperature=1.0, top_p=1.0, top_k=None, min_p=0.0)


def test_a_checkpoint_directory_has_its_generation_config(make_hf_checkpoint) -> None:  # type: ignore[no-untyped-def]
    checkpoint: Path = make_hf_checkpoint("llama")
    assert model_sampling_defaults(str(checkpoint)) == SamplingDefaults()
    (checkpoint / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 0, "min_p": 0.05, "max_length": 99}))
    assert model_sampling_defaults(str(checkpoint)) == SamplingDefaults(0.6, 0.95, None, 0.05)


@pytest.mark.parametrize(("request_fields", "expected"), [
    ({}, (0.2, 0.9, None, 0.0)),
    ({"temperature": 0}, (0.0, 0.9, None, 0.0)),  # 0 is a value the request sets, not a missing one
    ({"temperature": 1.0, "top_p": 1.0, "top_k": 40, "min_p": 0.05}, (1.0, 1.0, 40, 0.05)),
    ({"temperature": None, "min_p": 0.1}, (0.2, 0.9, None, 0.1)),  # null: unset, as OpenAI's API reads it
])
def test_what_a_request_sets_wins_over_the_defaults(request_fields: dict[str, float | None],
                                                    expected: tuple[float, float, int | None, float]) -> None:
    body = ChatCompletionRequest.model_validate({"model": "smollm2", "messages": QUESTION, **request_fields})
    params = body.sampling_params(SMOLLM2_CARD, max_tokens=8, logprobs=None, choice=0)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == expected


@pytest.fixture(scope="module")
def smollm2_url() -> Iterator[str]:
    settings = GatewaySettings(model="smollm2", port=free_port())
    with running_gateway(settings, LLMEngine("smollm2", EngineSettings(num_kv_blocks=128))) as url:
        yield url


def test_responses_echo_the_sampling_they_ran_with(smollm2_url: str) -> None:
    def create(**fields: float) -> dict[str, object]:
        body = {"model": "smollm2", "input": "Say hi.", "max_output_tokens": 2, "store": False, **fields}
        response = httpx.post(f"{smollm2_url}/v1/responses", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    defaulted = create()
    assert (defaulted["temperature"], defaulted["top_p"]) == (0.2, 0.9)
    chosen = create(temperature=0.7, top_p=1.0, min_p=1.0)
    assert (chosen["temperature"], chosen["top_p"]) == (0.7, 1.0)


def test_min_p_one_is_greedy_on_every_surface(smollm2_url: str) -> None:
    """min_p 1 keeps only the most likely token: at temperature 1.5 every seed gives the greedy reply, so the
    parameter reached the engine's sampler."""
    client = openai_client(smollm2_url)
    greedy = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8, temperature=0)
    for seed in (1, 2):
        reply = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8, temperature=1.5,
                                               seed=seed, extra_body={"min_p": 1.0})
        assert reply.choices[0].message.content == greedy.choices[0].message.content
    prompt = "The capital of France is"
    plain = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    filtered = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=1.5, seed=3,
                                         extra_body={"min_p": 1.0})
    assert filtered.choices[0].text == plain.choices[0].text
    body = {"model": "smollm2", "input": "What is the capital of France?", "max_output_tokens": 8, "store": False}
    texts = [httpx.post(f"{smollm2_url}/v1/responses", json={**body, **fields}, timeout=120).json()["output"][0]
             ["content"][0]["text"] for fields in ({"temperature": 0}, {"temperature": 1.5, "min_p": 1.0})]
    assert texts[0] == texts[1]


def test_min_p_out_of_range_is_a_400(smollm2_url: str) -> None:
    response = httpx.post(f"{smollm2_url}/v1/chat/completions", timeout=60,
                          json={"model": "smollm2", "messages": QUESTION, "min_p": 1.5})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "min_p"


@pytest.fixture
def chat_upstream() -> Iterator[tuple[Fake, str]]:
    """An OpenAI chat server on loopback that records the bodies it receives."""
    fake = Fake("chat")
    with serving(fake.app(), free_port()) as url:
        yield fake, url


def test_upstreams_get_the_resolved_sampling_and_top_k_and_min_p_where_set(
        chat_upstream: tuple[Fake, str]) -> None:
    """Through an upstream, the model's defaults fill temperature and top_p as on the embedded engine; top_k and
    min_p go only where the request sets them (otherwise the upstream's own apply)."""
    chat, upstream_url = chat_upstream
    settings = GatewaySettings(model="smollm2", port=free_port(), default_max_tokens=8,
                               upstreams=[upstream_url + "/v1"])
    ask = {"model": "smollm2", "messages": QUESTION, "max_tokens": 4}
    with running_gateway(settings) as url:
        for fields in ({}, {"temperature": 0.7, "top_k": 40, "min_p": 0.05}):
            assert httpx.post(f"{url}/v1/chat/completions", json={**ask, **fields}, timeout=60).status_code == 200
    defaulted, chosen = (seen["body"] for seen in chat.seen)
    assert (defaulted["temperature"], defaulted["top_p"]) == (0.2, 0.9)
    assert "top_k" not in defaulted and "min_p" not in defaulted
    assert (chosen["temperature"], chosen["top_p"], chosen["top_k"], chosen["min_p"]) == (0.7, 0.9, 40, 0.05)
