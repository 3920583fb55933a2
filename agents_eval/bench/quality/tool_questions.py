"""What one tool call returned, and the question about it whose answer only that output holds.

Name pools are shared by the shell and web generators. Every answer is drawn at random (versions, codes,
amounts, numbers), so a model cannot guess it without reading the observation. Each question names the key
that sits next to its answer ("the Grand Total", "the error code in the UpstreamError line"): a 135M model
copies a value found by its key, but does not resolve structure (an element id in brackets, the row of a
table, a file under one `git status` heading) well enough for the measure to tell history handling apart
from noise.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["listing", "log", "tree", "json"]
KINDS: tuple[Kind, ...] = ("listing", "log", "tree", "json")

MODULES = ("billing", "checkout", "auth", "inventory", "search", "notifier", "scheduler", "payments", "reports",
           "ledger", "catalog", "shipping", "accounts", "webhooks")
FILE_STEMS = ("handler", "models", "views", "routes", "serializers", "tasks", "client", "cache", "settings",
              "utils", "schema", "worker", "signals", "admin", "forms", "queries", "retry", "events")
NOUNS = ("Order", "Payment", "Invoice", "Inventory", "Shipment", "Coupon", "Account", "Session", "Refund", "Ledger")
PROBLEMS = ("Validation", "Lock", "Timeout", "Declined", "Conflict", "Mismatch", "Quota", "State", "Integrity")
PRODUCTS = ("Anker 7-Port USB Hub", "Logitech MX Keys", "Sony WH-1000XM4", "Kindle Paperwhite", "Instant Pot Duo",
            "Fitbit Charge 5", "Roku Express", "Bose SoundLink Flex", "Nintendo Pro Controller", "Ring Doorbell 4",
            "Dyson V8 Filter", "Philips Hue Bulb", "Garmin Forerunner 55", "JBL Clip 4", "Echo Dot Kids")


@dataclass(frozen=True)
class Observation:
    """A tool result as the agent saw it. `command` is how the assistant names the call in its own words."""

    kind: Kind
    tool: str  # shell | browser | http
    command: str
    arguments: dict[str, Any]
    text: str
    question: str  # names the key next to the answer; ends with how to answer
    answer: str
    subkind: str  # which generator: ls, git, find, traceback, java, deploy, order_page, ...


Generator = Callable[[random.Random], Observation]


def code(rng: random.Random, prefix: str, digits: int = 4) -> str:
    return f"{prefix}-{rng.randint(10 ** (digits - 1), 10 ** digits - 1)}"


def stamp(rng: random.Random, day: int) -> str:
    return f"2024-05-{day:02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"


def exception_name(rng: random.Random) -> str:
    return f"{rng.choice(NOUNS)}{rng.choice(PROBLEMS)}Exception"
