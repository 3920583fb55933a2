"""Real text for the prompts, from the Python standard library of the interpreter running the benchmark: its
documentation (`pydoc_data.topics`, the prose `python -m pydoc` prints) and its own source files, shown as an
agent's shell tools show them (a file viewer with line numbers, `grep -n`, `pydoc`). Budgets are in tokens,
turned into characters at the rate SmolLM2's tokenizer shows on each kind of text (the servers report the
exact token counts)."""

from __future__ import annotations

import functools
import random
import sysconfig
from pathlib import Path

PROSE_CHARS_PER_TOKEN = 4.35
CODE_CHARS_PER_TOKEN = 2.78  # indentation and punctuation
MIN_SOURCE_CHARS = 4000
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "turtledemo", "__pycache__"})
GREP_PATTERNS = ("raise ValueError", "def __init__", "return None", "self._", "import ", "isinstance(",
                 "except ", "yield ", "with open(", "assert ")


def chars_for(tokens: int, chars_per_token: float = PROSE_CHARS_PER_TOKEN) -> int:
    return max(1, round(tokens * chars_per_token))


@functools.cache
def doc_topics() -> tuple[tuple[str, str], ...]:
    from pydoc_data.topics import topics

    return tuple(sorted(topics.items()))


@functools.cache
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.cache
def source_files() -> tuple[Path, ...]:
    files = sorted(stdlib_root().glob("*/*.py")) + sorted(stdlib_root().glob("*.py"))
    return tuple(f for f in files if EXCLUDED_DIRS.isdisjoint(f.relative_to(stdlib_root()).parts)
                 and f.stat().st_size >= MIN_SOURCE_CHARS)


@functools.cache
def source_lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8", errors="replace").splitlines())


def _relative(path: Path) -> str:
    return "Lib/" + path.relative_to(stdlib_root()).as_posix()


def fill(lines: list[str], n_chars: int) -> str:
    """Whole lines from the start until `n_chars` is reached (at least one line)."""
    kept: list[str] = []
    size = 0
    for line in lines:
        if kept and size + len(line) + 1 > n_chars:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept)


def prose(start: int, tokens: int) -> str:
    """Documentation topics in order from topic `start` (wrapping round), about `tokens` long."""
    topics, n_chars = doc_topics(), chars_for(tokens)
    lines: list[str] = []
    for offset in range(len(topics)):
        lines += topics[(start + offset) % len(topics)][1].splitlines()
        if sum(len(line) + 1 for line in lines) >= n_chars:
            break
    return fill(lines, n_chars)


def file_view(rng: random.Random, n_chars: int) -> str:
    path = rng.choice(source_files())
    lines = source_lines(path)
    first = rng.randrange(max(1, len(lines) - 40))
    numbered = [f"{first + i + 1}:{line}" for i, line in enumerate(lines[first:])]
    header = f"$ open {_relative(path)} {first + 1}\n[File: {_relative(path)} ({len(lines)} lines total)]\n"
    return header + fill(numbered, n_chars - len(header)) + f"\n({len(lines) - first} lines below the top)"


def grep(rng: random.Random, n_chars: int) -> str:
    pattern = rng.choice(GREP_PATTERNS)
    header = f'$ grep -rn "{pattern}" Lib/\n'
    found: list[str] = []
    size = len(header)
    for path in rng.sample(source_files(), len(source_files())):
        for number, line in enumerate(source_lines(path), start=1):
            if pattern in line:
                found.append(f"{_relative(path)}:{number}:{line.rstrip()}")
                size += len(found[-1]) + 1
        if size >= n_chars:
            break
    return header + fill(found, n_chars - len(header))


def pydoc(rng: random.Random, n_chars: int) -> str:
    name, text = rng.choice(doc_topics())
    header = f"$ python -m pydoc {name}\n"
    return header + fill(text.splitlines(), n_chars - len(header))


TOOLS = ((file_view, CODE_CHARS_PER_TOKEN), (grep, CODE_CHARS_PER_TOKEN), (pydoc, PROSE_CHARS_PER_TOKEN))


def observation(rng: random.Random, tokens: int) -> str:
    """One tool's output, about `tokens` long."""
    tool, chars_per_token = rng.choice(TOOLS)
    return tool(rng, chars_for(tokens, chars_per_token))
