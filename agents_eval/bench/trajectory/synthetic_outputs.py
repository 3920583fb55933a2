"""Seeded synthetic tool observations as agents see them: service logs, shell output (test runs, listings,
grep), browser accessibility trees and JSON API responses, each cut to a token budget; and what `prune`
removes from them with the configured per-tool rules.

The text carries what real tool output carries and pruning targets: back-to-back repeated lines, aligned
columns, long punctuation rules, blank-line runs, repeated subtrees; JSON stays well-formed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from trajectory.pruning.prune import PruningConfig, prune

ObservationKind = Literal["log", "shell", "browser", "json"]
KINDS: tuple[ObservationKind, ...] = ("log", "shell", "browser", "json")
KIND_TOOLS: dict[ObservationKind, str] = {"log": "log", "shell": "shell", "browser": "browser", "json": "api"}

CountTokens = Callable[[str], int]
Chunk = Callable[[random.Random], list[str]]

MODULES = ("core", "utils", "parser", "server", "models", "cli", "config", "cache")
FILES = ("__init__.py", "main.py", "views.py", "models.py", "tests.py", "utils.py", "README.md", "setup.cfg")
WORDS = ("request", "session", "token", "worker", "handler", "record", "buffer", "index", "query", "batch")
PRODUCTS = ("Wireless Mouse", "USB-C Hub", "Mechanical Keyboard", "Laptop Stand", "HDMI Cable", "Webcam")


def _stamp(rng: random.Random) -> str:
    return f"2024-05-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:" \
           f"{rng.randint(0, 59):02d},{rng.randint(0, 999):03d}"


def _log_events(rng: random.Random) -> list[str]:
    level = rng.choice(("INFO ", "INFO ", "DEBUG", "WARN "))
    return [f"{_stamp(rng)} {level} [worker-{rng.randint(1, 8)}]   {rng.choice(WORDS)} "
            f"{rng.randint(1, 9999)} done in {rng.randint(1, 900)} ms" for _ in range(rng.randint(2, 5))]


def _log_retries(rng: random.Random) -> list[str]:
    line = f"WARNING: connection to {rng.choice(('db', 'redis', 'api'))}:{rng.randint(1000, 9999)} refused, " \
           f"retrying in {rng.randint(1, 9)}s ..."
    return [line] * rng.randint(3, 9)


def _log_traceback(rng: random.Random) -> list[str]:
    module = rng.choice(MODULES)
    return ["Traceback (most recent call last):",
            f'  File "/app/src/{module}/{rng.choice(FILES)}", line {rng.randint(10, 400)}, in handle',
            f"    result = self.{rng.choice(WORDS)}(payload)",
            f"KeyError: '{rng.choice(WORDS)}_id'", "", "", ""]


def _shell_pytest(rng: random.Random) -> list[str]:
    dots = "".join(rng.choice("....F.s") for _ in range(rng.randint(8, 30)))
    percent = f"[{rng.randint(1, 100):3d}%]"
    return [f"tests/test_{rng.choice(MODULES)}.py {dots}{' ' * rng.randint(10, 40)}{percent}",
            "=" * rng.randint(20, 60) + " FAILURES " + "=" * rng.randint(20, 60),
            f"E       AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}",
            "-" * rng.randint(30, 70)]


def _shell_listing(rng: random.Random) -> list[str]:
    folder = rng.choice(MODULES)
    lines = [f"./src/{folder}:"]
    for name in rng.sample(FILES, rng.randint(3, 6)):
        size = rng.randint(0, 99999)
        lines.append(f"-rw-r--r--  1 agent  staff  {size:>6}  May {rng.randint(1, 28):2d} 12:{rng.randint(0, 59):02d}"
                     f"  {name}")
    return [*lines, ""]


def _shell_grep(rng: random.Random) -> list[str]:
    return [f"src/{rng.choice(MODULES)}/{rng.choice(FILES)}:{rng.randint(1, 300)}:    from {rng.choice(MODULES)} "
            f"import {rng.choice(WORDS)}" for _ in range(rng.randint(2, 5))]


def _shell_install(rng: random.Random) -> list[str]:
    package = rng.choice(("inflight@1.0.6", "glob@7.2.3", "rimraf@3.0.2", "uuid@3.4.0"))
    warning = f"npm WARN deprecated {package}: This module is not supported, and leaks memory."
    return [f"npm install --save-dev {rng.choice(WORDS)}-lint", *[warning] * rng.randint(2, 6),
            f"added {rng.randint(10, 900)} packages in {rng.randint(1, 60)}s"]


def _browser_card(rng: random.Random) -> list[str]:
    node = rng.randint(100, 9999)
    return [f"  [{node}] article ''",
            f"    [{node + 1}] link '{rng.choice(PRODUCTS)} {rng.choice(('Pro', 'Mini', 'X2', ''))}'",
            f"      StaticText '${rng.randint(5, 199)}.{rng.randint(0, 99):02d}'",
            "      StaticText 'Free delivery'", "      StaticText 'Sponsored'",
            f"    [{node + 2}] button 'Add to cart'", "    image ''", "    separator ''"]


def _browser_pagination(rng: random.Random) -> list[str]:
    page = rng.randint(1, 9)
    return ["  navigation 'Pagination'", f"    [{rng.randint(100, 9999)}] link 'Page {page}'",
            f"    [{rng.randint(100, 9999)}] link 'Page {page + 1}'", "    StaticText '...'"]


CHUNKS: dict[ObservationKind, tuple[Chunk, ...]] = {
    "log": (_log_events, _log_events, _log_retries, _log_traceback),
    "shell": (_shell_pytest, _shell_listing, _shell_grep, _shell_install),
    "browser": (_browser_card, _browser_card, _browser_card, _browser_pagination),
}
HEADERS: dict[ObservationKind, list[str]] = {
    "browser": ["RootWebArea 'Shop - search results' focused: True", "  navigation 'Main'", "    link 'Home'",
                "    link 'Deals'", "    link 'Help'", "    StaticText '|'", "    link 'Sign in'"],
}


def _json_item(rng: random.Random, index: int) -> dict[str, Any]:
    return {"id": index, "title": f"{rng.choice(WORDS)} fails on {rng.choice(MODULES)}",
            "state": rng.choice(("open", "closed")), "comments": rng.randint(0, 40)}


def _json_text(items: list[dict[str, Any]], indent: int | None) -> str:
    return json.dumps({"total": len(items), "items": items}, indent=indent)


def _json_observation(rng: random.Random, target_tokens: int, count: CountTokens) -> str:
    """Pretty-printed like most API tools print it, compact when one pretty item would not fit."""
    items = [_json_item(rng, 1)]
    indent = 2 if count(_json_text(items, 2)) <= target_tokens else None
    while count(_json_text(items, indent)) < target_tokens:
        items.append(_json_item(rng, len(items) + 1))
    if len(items) > 1 and count(_json_text(items, indent)) > target_tokens:
        items.pop()
    return _json_text(items, indent)


def _trimmed(lines: list[str], target_tokens: int, count: CountTokens) -> str:
    while len(lines) > 1 and count("\n".join(lines)) > target_tokens:
        lines.pop()
    return "\n".join(lines)


def observation(kind: ObservationKind, rng: random.Random, target_tokens: int, count: CountTokens) -> str:
    """One observation of `kind` of about `target_tokens` tokens (at most that, unless one line is more)."""
    if kind == "json":
        return _json_observation(rng, target_tokens, count)
    lines = list(HEADERS.get(kind, []))
    while count("\n".join(lines)) < target_tokens:
        lines += rng.choice(CHUNKS[kind])(rng)
    return _trimmed(lines, target_tokens, count)


@dataclass(frozen=True)
class PruningFigure:
    tool: str
    observations: int
    tokens_before: int
    tokens_after: int

    @property
    def removed_share(self) -> float:
        return 1.0 - self.tokens_after / self.tokens_before if self.tokens_before else 0.0


def measure_pruning(kind: ObservationKind, samples: int, target_tokens: int, config: PruningConfig,
                    count: CountTokens, seed: int) -> PruningFigure:
    """Tokens before and after `prune` with `config`'s rules for the tool that produces `kind`."""
    rng = random.Random(f"{seed}:pruning:{kind}")
    tool = KIND_TOOLS[kind]
    results = [prune(observation(kind, rng, target_tokens, count), "tool", tool, config, count)
               for _ in range(samples)]
    return PruningFigure(tool, samples, sum(r.tokens_before for r in results), sum(r.tokens_after for r in results))
