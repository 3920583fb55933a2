"""Seeded inputs of the structured-outputs benchmark: agent tasks offering 1-4 tools of the quality benchmark's
kinds (shell, browser, http, and a file reader), and pydantic-style output schemas. Every tool's parameters and
every schema is a pydantic model, so replies are validated by pydantic, not by the grammar library under test.
Strings are bounded, as an agent's action schema bounds them, so a whole reply fits the benchmark's max_tokens: a
grammar holds a reply to its form, not to a length, and a reply cut by max_tokens is invalid JSON."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

SYSTEM = "You are an autonomous agent working on an online shop. You act through tools."


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Shell(Strict):
    command: str = Field(max_length=60)


class Browser(Strict):
    action: Literal["open", "click", "type", "scroll"]
    target: str = Field(max_length=40)


class Http(Strict):
    method: Literal["GET", "POST", "PUT", "DELETE"]
    url: str = Field(max_length=40)


class ReadFile(Strict):
    path: str = Field(max_length=40)
    lines: int = Field(ge=1, le=500)


TOOLS: dict[str, tuple[type[Strict], str]] = {
    "shell": (Shell, "Run a shell command in the shop's server."),
    "browser": (Browser, "Act on the shop's admin web page."),
    "http": (Http, "Send an HTTP request to the shop's API."),
    "read_file": (ReadFile, "Read the first lines of a file."),
}
GOALS = ("list the files in /var/www/shop", "check the status of order 4821", "restart the web server",
         "find the price of SKU-20931", "read the first 20 lines of the error log", "open the orders page",
         "look up the inventory of SKU-77310", "see which process uses port 8080", "cancel order 1093",
         "read config/settings.yaml", "search the admin page for customer Alice Moreau", "count the open tickets")


@dataclass(frozen=True)
class AgentTask:
    index: int
    goal: str
    tools: tuple[str, ...]

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Please {self.goal}."}]

    def chat_tools(self) -> list[dict[str, Any]]:
        return [tool_schema(name) for name in self.tools]


def tool_schema(name: str) -> dict[str, Any]:
    model, description = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": description, "strict": True,
                                             "parameters": model.model_json_schema()}}


def agent_tasks(count: int, seed: int) -> list[AgentTask]:
    rng = random.Random(seed)
    return [AgentTask(i, rng.choice(GOALS), tuple(rng.sample(sorted(TOOLS), rng.randint(1, 4))))
            for i in range(count)]


ShortText = Annotated[str, Field(max_length=16)]
FIELD_KINDS: list[tuple[str, Any, dict[str, Any]]] = [
    ("name", str, {"max_length": 24}), ("city", str, {"max_length": 24}), ("count", int, {"ge": 0, "le": 1000}),
    ("price", float, {"ge": 0, "le": 10000}), ("in_stock", bool, {}), ("tags", list[ShortText], {"max_length": 3}),
    ("status", Literal["open", "shipped", "cancelled"], {}), ("email", str, {"max_length": 30}),
    ("quantity", int, {"ge": 1, "le": 99}), ("rating", int, {"ge": 1, "le": 5}),
]
SUBJECTS = ("a customer", "an order", "a product", "a support ticket", "a shipment", "a store", "a review")


@dataclass(frozen=True)
class SchemaTask:
    index: int
    subject: str
    model: type[BaseModel]

    def messages(self) -> list[dict[str, str]]:
        fields = ", ".join(self.model.model_fields)
        return [{"role": "user", "content": f"Describe {self.subject} as JSON with the fields {fields}."}]


def schema_tasks(count: int, seed: int) -> list[SchemaTask]:
    """Models of 2-5 fields, a third of them with a nested object."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        chosen = rng.sample(FIELD_KINDS, rng.randint(2, 5))
        fields: dict[str, Any] = {name: (kind, Field(**limits)) for name, kind, limits in chosen}
        if index % 3 == 2:
            fields["address"] = (create_model("Address", __base__=Strict, street=(str, Field(max_length=30)),
                                              zip=(str, Field(max_length=8))), ...)
        tasks.append(SchemaTask(index, rng.choice(SUBJECTS), create_model(f"Schema{index}", __base__=Strict,
                                                                          **fields)))
    return tasks
