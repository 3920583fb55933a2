"""Compact JSON bytes, fast: orjson, with the standard library for what orjson refuses (lone surrogates in
strings, integers past 64 bits), so every value `json.dumps` writes still gets written."""

from __future__ import annotations

import json
from typing import Any

import orjson

OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> bytes:
    """Compact JSON, UTF-8; a float that is not finite becomes null (orjson), and a value orjson refuses is
    written by `json.dumps` with non-ASCII characters escaped."""
    try:
        return orjson.dumps(value, option=OPTIONS)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def loads(data: bytes | str) -> Any:
    """JSON to Python values; ValueError (orjson.JSONDecodeError) when it is not JSON."""
    return orjson.loads(data)
