"""Names of stored blocks: the chained block hash, under the model's and the mask rules' fingerprint, so a
store shared by several models, dtypes or block sizes never serves one's KV to another."""

from __future__ import annotations

import hashlib
import json
from typing import Any

KEY_PREFIX = "agentserve-kv"


def model_fingerprint(identity: dict[str, Any]) -> str:
    """16 hex digits over whatever makes KV differ: architecture config, weights' source, dtype, block size."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def namespace(model: str, mask_rule: str) -> str:
    return f"{KEY_PREFIX}:{model}:{mask_rule}"


def block_key(space: str, block_hash: int) -> str:
    return f"{space}:{block_hash:016x}"
