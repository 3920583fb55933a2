"""The gateway in front of upstream OpenAI-compatible engines (vLLM, SGLang, llama.cpp's server, another
agentserve): a health-checked pool of replicas, session-affine routing by consistent hashing with bounded
loads, failover within the request's budget, and vLLM prefill/decode instances driven through
`kv_transfer_params`. `UpstreamEngine` stands where the embedded engine stands (`gateway.api.generation`), so
sessions, auth, limits, metrics and the Responses API (HTTP and WebSocket) work unchanged in front of it."""
