"""The answer check: the expected string, normalized, appears in the normalized answer as a whole word."""

from __future__ import annotations

import re

QUOTES = re.compile(r"[`'\"“”‘’*]")
SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Lower case, quotes and markdown emphasis dropped, whitespace runs as one space."""
    return SPACES.sub(" ", QUOTES.sub("", text.lower())).strip()


def mentions(text: str, expected: str) -> bool:
    """Whether `text` holds `expected` not glued to letters or digits: "37" is in "37 units", not in "137"."""
    pattern = rf"(?<![a-z0-9]){re.escape(normalize(expected))}(?![a-z0-9])"
    return re.search(pattern, normalize(text)) is not None
