"""Server launchers: `process` (any server as a child process), `gateway`, `redis`. A peer server (llama.cpp's
`llama-server`) gets its launcher here too, started through `process.running_process`."""
