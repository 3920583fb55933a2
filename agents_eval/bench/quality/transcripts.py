"""Seeded multi-turn agent transcripts, each ending in a question that one observation answers.

A transcript is a system prompt, the user's task, 10 tool calls (an assistant message naming the call,
with an OpenAI function call, then the `tool` message with its result) and the user's question. Transcript
i asks about a kind (listing, log, tree, json) and about the observation at one of the 10 positions; both
cycle with period 40, so every (kind, position) pair is asked equally often and every position, oldest to
last, is asked about in one transcript of 10.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Literal

from agents_eval.bench.quality.answers import mentions
from agents_eval.bench.quality.shell_outputs import LISTINGS, LOGS
from agents_eval.bench.quality.tool_questions import KINDS, Generator, Kind, Observation
from agents_eval.bench.quality.web_outputs import JSONS, TREES
from trajectory.template.types import Message

Position = Literal["last", "older"]
POSITIONS: tuple[Position, ...] = ("last", "older")
GENERATORS: dict[Kind, tuple[Generator, ...]] = {"listing": LISTINGS, "log": LOGS, "tree": TREES, "json": JSONS}
ALL_GENERATORS = tuple(g for kind in KINDS for g in GENERATORS[kind])
OBSERVATIONS = 10  # tool observations per transcript (real swe sessions have about 18 turns)

SYSTEM = ("You are an autonomous agent working on an online shop. You act through tools: a shell, a web "
          "browser and an HTTP client. When asked about the session, answer briefly from the tool outputs.")
TASKS = ("The nightly order sync failed. Find out why and check the affected orders.",
         "Customers report checkout errors since this morning's deploy. Investigate.",
         "Prepare the weekly operations summary: deploys, failures, stock and open issues.",
         "A refund batch got stuck. Find the cause and the orders involved.")
LEADS = ("Let me run `{}`.", "Next I will check `{}`.", "Running `{}` to see what happened.", "I'll look at `{}`.")


@dataclass(frozen=True)
class Transcript:
    index: int
    task: str
    leads: tuple[str, ...]  # the assistant's words before each call
    observations: tuple[Observation, ...]
    target: int  # which observation holds the answer

    @property
    def question(self) -> str:
        return self.observations[self.target].question

    @property
    def answer(self) -> str:
        return self.observations[self.target].answer

    @property
    def kind(self) -> Kind:
        return self.observations[self.target].kind

    @property
    def position(self) -> Position:
        return "last" if self.target == len(self.observations) - 1 else "older"

    @property
    def age(self) -> int:
        """Tool observations after the one holding the answer (0: it is the last one)."""
        return len(self.observations) - 1 - self.target

    def message_groups(self) -> list[list[Message]]:
        """The messages as the agent sent them, turn by turn: task, then one call and its result per turn,
        then the question."""
        groups = [[Message("system", SYSTEM), Message("user", self.task)]]
        for step, (lead, observation) in enumerate(zip(self.leads, self.observations, strict=True), 1):
            call_id = f"call_{step}"
            call = {"id": call_id, "type": "function",
                    "function": {"name": observation.tool, "arguments": json.dumps(observation.arguments)}}
            groups.append([Message("assistant", lead, tool_calls=[call]),
                           Message("tool", observation.text, tool_call_id=call_id, name=observation.tool)])
        groups.append([Message("user", self.question)])
        return groups


def generate_transcripts(count: int, seed: int) -> list[Transcript]:
    rng = random.Random(seed)
    return [_transcript(index, rng) for index in range(count)]


def cell(index: int) -> tuple[Kind, int]:
    """The kind and the observation (0: the oldest) transcript `index` asks about: the target cycles over the
    positions, the kind moves on by one each full cycle, so period 40 covers all 40 pairs."""
    target = index % OBSERVATIONS
    return KINDS[(index + index // OBSERVATIONS) % len(KINDS)], target


def _transcript(index: int, rng: random.Random) -> Transcript:
    kind, target = cell(index)
    while True:
        transcript = _draw(index, kind, target, rng)
        if answer_only_in_target(transcript):
            return transcript


def _draw(index: int, kind: Kind, target: int, rng: random.Random) -> Transcript:
    count = OBSERVATIONS
    asked = rng.choice(GENERATORS[kind])
    others = rng.sample([g for g in ALL_GENERATORS if g is not asked], count - 1)
    generators = [*others[:target], asked, *others[target:]]
    observations = tuple(generate(rng) for generate in generators)
    leads = tuple(rng.choice(LEADS).format(o.command) for o in observations)
    return Transcript(index, rng.choice(TASKS), leads, observations, target)


def answer_only_in_target(transcript: Transcript) -> bool:
    """The answer is in the observation asked about and nowhere else: not in other observations, the
    assistant's words or the question."""
    texts = [o.text for i, o in enumerate(transcript.observations) if i != transcript.target]
    texts += [*transcript.leads, transcript.question, transcript.task]
    return mentions(transcript.observations[transcript.target].text, transcript.answer) and \
        not any(mentions(text, transcript.answer) for text in texts)
