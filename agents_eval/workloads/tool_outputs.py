"""Tool output as the generated agents' tools return it, cut to an exact token count.

An observation is drawn from the quality bench's generators (agents_eval.bench.quality): a `shell` tool
returns listings (`ls -la`, `git status`, `find`) and logs (Python tracebacks, Java exceptions, deploy logs),
each under its `$ command` line; a `browser` tool returns one page's accessibility tree. Both carry the
redundancy real output carries and the pruning rules of configs/pruning.yaml remove: aligned columns,
punctuation rules, back-to-back repeated lines, blank-line runs, repeated subtrees. Outputs are joined until
the text holds enough tokens, then cut (`TokenCut`) to exactly the turn's size: the cut may fall mid-line,
as a tool's truncated output does.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Hashable

from agents_eval.bench.quality import shell_outputs, web_outputs
from agents_eval.bench.quality.tool_questions import Generator, Observation
from agents_eval.workloads.text import NoExactPrefixError, TokenCut
from engine.model.tokenizer import Tokenizer

CHARS_PER_TOKEN = 5  # more than this text takes a token in the built-in and SmolLM2 tokenizers (3-4)
SOURCES: dict[str, tuple[Generator, ...]] = {
    "shell": (*shell_outputs.LISTINGS, *shell_outputs.LOGS),
    "browser": web_outputs.TREES,
}


def _render(tool: str, observation: Observation, first: bool) -> str:
    """A shell output under its command line; a later tree's nodes go under the first tree's root (one page)."""
    if tool == "shell":
        return f"$ {observation.command}\n{observation.text}"
    return observation.text if first else observation.text.split("\n", 1)[-1]


class ToolOutputs:
    """`text(tool, key, n)`: the same text for the same tool, key, n and seed, exactly n tokens long."""

    MAX_DRAWS = 32  # fresh observations tried when no prefix of one has exactly n tokens (rare)

    def __init__(self, tokenizer: Tokenizer, seed: int = 0) -> None:
        self.cutter = TokenCut(tokenizer)
        self.seed = seed

    def text(self, tool: str, key: Hashable, n_tokens: int) -> str:
        if tool not in SOURCES:
            raise ValueError(f"no observations for tool {tool!r}; known: {', '.join(SOURCES)}")
        rng = random.Random(f"{self.seed}:{tool}:{key!r}")
        for _ in range(self.MAX_DRAWS):
            joined, ids = self._draw(tool, rng, n_tokens)
            with contextlib.suppress(NoExactPrefixError):
                return self.cutter.cut(joined, n_tokens, ids)
        raise NoExactPrefixError(f"no {tool} output of exactly {n_tokens} tokens in {self.MAX_DRAWS} draws")

    def _draw(self, tool: str, rng: random.Random, n_tokens: int) -> tuple[str, list[int]]:
        """Outputs joined until the text holds at least `n_tokens`, and its tokens (encoded only once the
        characters make that likely)."""
        parts: list[str] = []
        chars = n_tokens * CHARS_PER_TOKEN
        while True:
            parts.append(_render(tool, rng.choice(SOURCES[tool])(rng), not parts))
            if sum(len(part) + 1 for part in parts) >= chars:
                joined = "\n".join(parts)
                ids = self.cutter.tokenizer.encode(joined)
                if len(ids) >= n_tokens:
                    return joined, ids
                chars *= 2
