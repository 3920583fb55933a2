"""A worker process's side: its loop, the hand-off of a request, and KV streamed out and assembled in."""
