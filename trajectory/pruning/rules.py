"""The pruning rules: protected spans, per-line rules (whitespace, punctuation, stop words), duplicate and
blank lines. Every rule maps its own output to itself, so pruning twice changes nothing."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PUNCTUATION = string.punctuation + "─━═—–…·•"
STOP_WORDS = ("a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "if", "in", "into", "is",
              "it", "no", "not", "of", "on", "or", "so", "that", "the", "then", "there", "this", "to", "was",
              "were", "with")
DEFAULT_MARKER = "[... {count} repeated lines removed]"
RULE_NAMES = ("whitespace", "punctuation", "stop_words", "blank_lines", "duplicate_lines")
JSON_OPENERS = ("{", "[")
FENCE_OPENER = re.compile(r"[^\S\n]*(`{3,}|~{3,})")
WHITESPACE_RUN = re.compile(r"[^\S\n]{2,}")
WORD = re.compile(r"\w+")
JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
JSON_DECODER = json.JSONDecoder()

DuplicateMode = Literal["off", "consecutive", "all"]


class PruningRules(BaseModel):
    """What pruning removes from one message. Units in `PruneResult.removed`: characters for whitespace,
    punctuation and stop_words; lines for blank_lines and duplicate_lines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    whitespace: bool = True
    keep_indentation: bool = True
    max_blank_lines: int | None = Field(default=1, ge=0)
    punctuation: bool = True
    punctuation_min_run: int = Field(default=4, ge=2)
    punctuation_keep: int = Field(default=3, ge=1)
    punctuation_chars: str = PUNCTUATION
    stop_words: tuple[str, ...] = STOP_WORDS
    duplicate_lines: DuplicateMode = "consecutive"
    duplicate_marker: str | None = DEFAULT_MARKER
    duplicate_marker_min_lines: int = Field(default=2, ge=1)
    duplicate_min_chars: int = Field(default=1, ge=1)
    protect_json_spans: bool = True

    @field_validator("duplicate_lines", mode="before")
    @classmethod
    def _yaml_off(cls, mode: object) -> object:
        return "off" if mode is False else mode

    @field_validator("punctuation_chars")
    @classmethod
    def _punctuation_only(cls, chars: str) -> str:
        if any(c.isalnum() or c.isspace() for c in chars):
            raise ValueError("punctuation_chars may hold neither letters, digits nor whitespace")
        return chars

    @field_validator("stop_words")
    @classmethod
    def _single_words(cls, words: tuple[str, ...]) -> tuple[str, ...]:
        bad = [w for w in words if not WORD.fullmatch(w)]
        if bad:
            raise ValueError(f"stop words must be single words: {bad}")
        return words

    @field_validator("duplicate_marker")
    @classmethod
    def _one_count_field(cls, marker: str | None) -> str | None:
        if marker is not None and (marker.count("{count}") != 1 or "\n" in marker):
            raise ValueError("duplicate_marker must be one line holding '{count}' exactly once")
        return marker

    @model_validator(mode="after")
    def _keep_shorter_than_run(self) -> PruningRules:
        if self.punctuation_keep >= self.punctuation_min_run:
            raise ValueError("punctuation_keep must be less than punctuation_min_run")
        return self

    @cached_property
    def punctuation_run(self) -> re.Pattern[str]:
        chars = "".join(re.escape(c) for c in self.punctuation_chars)
        return re.compile(rf"([{chars}])\1{{{self.punctuation_min_run - 1},}}")

    @cached_property
    def stop_word_run(self) -> re.Pattern[str] | None:
        if not self.stop_words:
            return None
        words = "|".join(sorted(map(re.escape, self.stop_words), key=len, reverse=True))
        return re.compile(rf"\b({words})\b(?:[^\S\n]+\1\b)+", re.IGNORECASE)

    @cached_property
    def marker_line(self) -> re.Pattern[str] | None:
        if self.duplicate_marker is None:
            return None
        before, after = self.duplicate_marker.split("{count}")
        return re.compile(rf"{re.escape(before)}\d+{re.escape(after)}")


@dataclass(frozen=True)
class Line:
    text: str
    protected: bool


def prune_lines(text: str, rules: PruningRules) -> tuple[str, dict[str, int]]:
    """`text` with every rule of `rules` applied outside protected spans, and what each rule removed."""
    removed: Counter[str] = Counter(dict.fromkeys(RULE_NAMES, 0))
    lines = [line if line.protected else Line(_prune_line(line.text, rules, removed), False)
             for line in split_protected(text, rules)]
    lines = _collapse_blank_lines(lines, rules.max_blank_lines, removed)
    lines = _drop_duplicate_lines(lines, rules, removed)
    lines = _collapse_blank_lines(lines, rules.max_blank_lines, removed)
    return "\n".join(line.text for line in lines), dict(removed)


def parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def split_protected(text: str, rules: PruningRules) -> list[Line]:
    """The lines of `text`, those in fenced code blocks, JSON spans and duplicate markers marked protected."""
    raw = text.split("\n")
    json_closers: list[int | None] = _json_closers(raw) if rules.protect_json_spans else [None] * len(raw)
    lines: list[Line] = []
    i = 0
    while i < len(raw):
        end = _protected_end(raw, json_closers, i, rules)
        lines += [Line(t, True) for t in raw[i:end]] if end > i else [Line(raw[i], False)]
        i = max(end, i + 1)
    return lines


def _protected_end(raw: list[str], json_closers: list[int | None], i: int, rules: PruningRules) -> int:
    """One past the last line of the protected span that starts at line `i`; `i` when none starts there."""
    line = raw[i]
    fence = FENCE_OPENER.match(line)
    if fence:
        return _fence_end(raw, i, fence.group(1))
    if rules.marker_line is not None and rules.marker_line.fullmatch(line):
        return i + 1
    closer = json_closers[i]
    if closer is not None and line.lstrip().startswith(JSON_OPENERS):
        return _json_end(raw, i, closer)
    return i


def _fence_end(raw: list[str], i: int, opener: str) -> int:
    closer = re.compile(rf"[^\S\n]*{re.escape(opener[0])}{{{len(opener)},}}[^\S\n]*")
    for j in range(i + 1, len(raw)):
        if closer.fullmatch(raw[j]):
            return j + 1
    return len(raw)


def _json_closers(raw: list[str]) -> list[int | None]:
    """Per line, the first later line at whose start the bracket depth (strings aside) is back to the depth at
    the start of that line; a JSON value opening the line can only end on the line before. None: no such line,
    or the depth falls below it first. Found for all lines in one pass, so no decode runs past its value."""
    depth = [0]
    for line in raw:
        bare = JSON_STRING.sub("", line)
        depth.append(depth[-1] + bare.count("[") + bare.count("{") - bare.count("]") - bare.count("}"))
    closers: list[int | None] = [None] * len(raw)
    open_lines: list[int] = []
    for k, level in enumerate(depth):
        while open_lines and level <= depth[open_lines[-1]]:
            i = open_lines.pop()
            closers[i] = k if level == depth[i] else None
        open_lines.append(k)
    return closers


def _json_end(raw: list[str], i: int, closer: int) -> int:
    """`closer` when lines `i` to `closer - 1` hold exactly one JSON value (and whitespace); `i` otherwise."""
    window = "\n".join(raw[i:closer]).lstrip()
    try:
        _, end = JSON_DECODER.raw_decode(window)
    except (ValueError, RecursionError):
        return i
    return closer if not window[end:].strip() else i


def _prune_line(line: str, rules: PruningRules, removed: Counter[str]) -> str:
    if rules.whitespace:
        line = _count("whitespace", line, _collapse_whitespace(line, rules.keep_indentation), removed)
    if rules.punctuation:
        shortened = rules.punctuation_run.sub(lambda m: m.group(1) * rules.punctuation_keep, line)
        line = _count("punctuation", line, shortened, removed)
    if rules.stop_word_run is not None:
        line = _count("stop_words", line, rules.stop_word_run.sub(r"\1", line), removed)
    return line


def _count(rule: str, before: str, after: str, removed: Counter[str]) -> str:
    removed[rule] += len(before) - len(after)
    return after


def _collapse_whitespace(line: str, keep_indentation: bool) -> str:
    body = line.rstrip()
    indent = len(body) - len(body.lstrip()) if keep_indentation else 0
    return body[:indent] + WHITESPACE_RUN.sub(" ", body[indent:])


def _collapse_blank_lines(lines: list[Line], max_blank_lines: int | None, removed: Counter[str]) -> list[Line]:
    if max_blank_lines is None:
        return lines
    kept: list[Line] = []
    blank_run = 0
    for line in lines:
        blank = not line.protected and not line.text.strip()
        blank_run = blank_run + 1 if blank else 0
        if blank_run <= max_blank_lines:
            kept.append(line)
    removed["blank_lines"] += len(lines) - len(kept)
    return kept


class _DuplicateFilter:
    """Remembers the lines seen so far in one message and tells which later ones repeat them."""

    def __init__(self, rules: PruningRules) -> None:
        self._all = rules.duplicate_lines == "all"
        self._min_chars = rules.duplicate_min_chars
        self._seen: set[str] = set()
        self._previous: str | None = None

    def is_duplicate(self, line: Line) -> bool:
        if line.protected:
            self._previous = None
            return False
        candidate = len(line.text.strip()) >= self._min_chars
        repeated = line.text in self._seen if self._all else line.text == self._previous
        self._previous = line.text
        if candidate:
            self._seen.add(line.text)
        return candidate and repeated


def _drop_duplicate_lines(lines: list[Line], rules: PruningRules, removed: Counter[str]) -> list[Line]:
    if rules.duplicate_lines == "off":
        return lines
    duplicates = _DuplicateFilter(rules)
    kept: list[Line] = []
    dropped_run = 0
    for line in lines:
        if duplicates.is_duplicate(line):
            dropped_run += 1
            removed["duplicate_lines"] += 1
            continue
        kept += _markers(dropped_run, rules)
        kept.append(line)
        dropped_run = 0
    return kept + _markers(dropped_run, rules)


def _markers(dropped: int, rules: PruningRules) -> list[Line]:
    """The marker line standing for `dropped` consecutive repeats; none for fewer than its minimum."""
    marker = rules.duplicate_marker
    if marker is None or dropped < rules.duplicate_marker_min_lines:
        return []
    return [Line(marker.replace("{count}", str(dropped)), True)]
