"""Server launchers: `process` (any server as a child process), `gateway`, `redis`, `llama_server` (llama.cpp's
`llama-server`), `litellm_proxy` (LiteLLM's proxy over upstreams), each started through
`process.running_process`."""
