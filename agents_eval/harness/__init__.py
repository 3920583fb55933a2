"""The one place benchmarks get their plumbing.

- `client`: the OpenAI client every benchmark sends requests with (chat completions streamed over SSE or
  answered as JSON, Responses over the WebSocket), one `Reply` record per request;
- `servers`: server processes (`process`: ports, readiness, logs, stop), the gateway (`gateway`), Redis
  (`redis`); a peer server's launcher goes beside them;
- `drive`: the open-loop session driver over `agents_eval.workloads.types`, retrying a refused turn after its
  `Retry-After` (bounded), and a closed-loop runner;
- `stats`: the one percentile definition (linear interpolation, numpy's default), summaries, units;
- `report`: `write_report`, and the `goals` list every `report.json` carries.
"""
