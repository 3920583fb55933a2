"""The prompts of `agentserve bench peer`, the same for every server: the single-stream decode prompts, the
long prefill prompts (documentation prose), and the agent sessions (a coding agent's system prompt, a task,
then one real tool observation per turn; history append-only)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agents_eval.bench.peer import text

SYSTEM_PROMPT = """You are an autonomous software engineering agent working in a checkout of the CPython \
standard library (the Lib/ folder). You solve the task you are given by running shell commands, one per \
turn, and reading their output.

Commands:
- open PATH [LINE]: show 100 lines of PATH from LINE, with line numbers.
- grep -rn PATTERN DIR: every line under DIR that contains PATTERN, as path:line:text.
- python -m pydoc TOPIC: the reference documentation of a language topic.
- edit START:END <<EOF ... EOF: replace lines START to END of the open file with the given text.
- pytest PATH: run the tests in PATH and show the summary.
- submit: finish; your edits become the patch.

Rules:
1. Answer with a short DISCUSSION (one or two sentences: what you learned, what you will do next), then \
exactly one COMMAND line. Never more than one command per turn.
2. Do not repeat a command whose output you already have; scroll or search instead.
3. Keep edits minimal and keep the file's style: indentation, naming, docstrings.
4. Run the relevant tests before you submit. If a test fails, read its traceback before editing again.
5. The environment has no network access and no interactive programs."""


@dataclass(frozen=True)
class SessionScript:
    """One agent session: its task, then one observation per turn (the first turn sends task and observation)."""

    task: str
    observations: tuple[str, ...]

    def user_message(self, turn: int) -> str:
        if turn == 0:
            return f"TASK:\n{self.task}\n\nOBSERVATION:\n{self.observations[0]}"
        return f"OBSERVATION:\n{self.observations[turn]}"


def sessions(count: int, turns: int, observation_tokens: int, seed: int) -> list[SessionScript]:
    """Observations drawn between half and 1.5x `observation_tokens`; every session its own task and tools."""
    scripts = []
    for index in range(count):
        rng = random.Random(f"peer:{seed}:{index}")
        task = text.prose(rng.randrange(len(text.doc_topics())), 60)
        sizes = [round(observation_tokens * rng.uniform(0.5, 1.5)) for _ in range(turns)]
        scripts.append(SessionScript(
            f"A user reports that the behaviour below is not what Lib/ implements. Find the code and fix it.\n"
            f"{task}", tuple(text.observation(rng, size) for size in sizes)))
    return scripts


def prefill_prompt(index: int, tokens: int) -> str:
    """Documentation prose of about `tokens` tokens; each index starts at another topic, so no run reuses
    another's KV beyond the chat template's first tokens."""
    start = (index * 7) % len(text.doc_topics())
    return f"Summarize this documentation in one sentence.\n\n{text.prose(start, tokens)}"


def decode_prompt(index: int) -> str:
    name = text.doc_topics()[(index * 11) % len(text.doc_topics())][0]
    return (f"Write a long, detailed tutorial for beginners about the Python topic '{name}', with several "
            "examples and an explanation of each step.")
