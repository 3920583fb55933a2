"""vLLM's disaggregated prefill/decode protocol, as its proxy (`tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py`) drives instances started with a KV connector (`kv_role` kv_producer / kv_consumer /
kv_both): the prefill leg is the client's request, not streamed, capped at one token and carrying
`kv_transfer_params` with `do_remote_decode: true`; the instance answers with the `kv_transfer_params` the
decode leg must carry (`do_remote_prefill`, `remote_engine_id`, `remote_block_ids`, `remote_host`,
`remote_port`, ...), and the decode instance pulls the KV from it. Both legs share one `X-Request-Id`."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.upstream.client import UpstreamFailed, check_status
from gateway.upstream.pool import Replica

PREFILL_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
    "remote_host": None, "remote_port": None,
}
NOT_FOR_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens")  # vLLM's prefill leg refuses them


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    prefill = {k: v for k, v in body.items() if k not in NOT_FOR_PREFILL}
    prefill.update(kv_transfer_params=dict(PREFILL_KV_TRANSFER_PARAMS), stream=False, max_tokens=1)
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    return prefill


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The client's request with the prefill instance's answer; without one, the decode instance prefills."""
    return {**body, "kv_transfer_params": kv_transfer_params} if kv_transfer_params else dict(body)


async def run_prefill(client: httpx.AsyncClient, replica: Replica, path: str, body: dict[str, Any],
                      headers: dict[str, str], timeout: httpx.Timeout) -> dict[str, Any] | None:
    """The prefill leg (`headers`: the decode leg's, X-Request-Id among them); the `kv_transfer_params` it
    returns for the decode leg."""
    try:
        response = await client.post(replica.name + path, json=prefill_body(body), timeout=timeout,
                                     headers={**replica.headers(), **headers})
    except httpx.HTTPError as error:
        raise UpstreamFailed(replica.name, f"prefill: {type(error).__name__}: {error}") from error
    check_status(replica, response, response.content)
    try:
        params = response.json().get("kv_transfer_params")
    except ValueError as error:
        raise UpstreamFailed(replica.name, f"prefill answer is not JSON: {error}") from error
    return dict(params) if isinstance(params, dict) else None
