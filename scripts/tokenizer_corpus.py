"""Seeded generator of the tokenizer corpus's generated_*.txt files (see train_tokenizer.py)."""

from __future__ import annotations

import importlib
import inspect
import json
import random
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

SEED = 20240517

DOC_MODULES = ("json", "textwrap", "shlex", "pathlib", "subprocess", "argparse", "logging", "urllib.parse",
               "collections", "itertools", "functools", "datetime", "re", "shutil", "tempfile", "csv",
               "sqlite3", "contextlib", "uuid", "hashlib", "socket", "threading", "queue", "asyncio")
CODE_MODULES = ("textwrap", "shlex", "json.encoder", "json.decoder", "fnmatch", "heapq", "string", "glob",
                "queue", "contextlib", "asyncio.queues", "csv", "base64", "tempfile", "dataclasses")
DOC_CHARS_PER_MODULE = 3_400
CODE_CHARS_PER_MODULE = 7_000

TASKS = (
    "Find the cheapest flight from Boston to Denver next Friday and add it to my cart.",
    "Summarize the open issues labelled bug in the repository and rank them by severity.",
    "Update the shipping address on order {n} to the one saved in my profile.",
    "Run the unit tests, fix whatever fails, and open a pull request with the change.",
    "What was the total revenue in March? Use the sales database.",
    "Book a table for {k} people at an Italian restaurant near the office tomorrow at 7pm.",
    "Rename the function parse_args to parse_cli_args everywhere in the project.",
    "Check the weather in {city} for the next three days and tell me if I need an umbrella.",
    "Create a new user account for jane.doe@example.com with the editor role.",
    "List the five most recent commits that touched the scheduler and explain what changed.",
    "Cancel my subscription and confirm the refund amount.",
    "Find a blue cotton t-shirt in size M under $30 with at least 4 stars.",
    "Why does the server return 502 after the deploy? Look at the logs.",
    "Write a Python function that deduplicates a list while keeping order, with tests.",
    "Post a comment on the merge request saying the benchmark numbers look good.",
)
CITIES = ("Boston", "Denver", "Paris", "Berlin", "Tokyo", "Seattle", "Austin", "Toronto", "Madrid", "Oslo")
WORDS = ("agent", "session", "turn", "cache", "block", "token", "prefill", "decode", "worker", "request",
         "latency", "queue", "order", "product", "customer", "invoice", "report", "config", "deploy",
         "server", "client", "browser", "page", "button", "link", "form", "field", "table", "review",
         "price", "rating", "cart", "account", "profile", "settings", "repository", "branch", "commit")
PRODUCTS = ("Blue Cotton T-Shirt", "Wireless Mouse", "Stainless Steel Water Bottle", "USB-C Charging Cable",
            "Noise Cancelling Headphones", "Running Shoes", "Ceramic Coffee Mug", "Mechanical Keyboard")
THOUGHTS = (
    "I need to {verb} the {noun} first, then check the {noun2}.",
    "The {noun} is not on this page. I will {verb} the {noun2} instead.",
    "That worked. Next I should {verb} the {noun} and confirm the result.",
    "The previous step failed with an error, so let me {verb} the {noun} again.",
    "Let me look at the {noun} to understand how the {noun2} is used.",
)
VERBS = ("open", "inspect", "update", "search", "filter", "click", "read", "check", "compare", "restart")
A11Y_ROLES = ("link", "button", "textbox", "StaticText", "heading", "combobox", "checkbox", "menuitem",
              "gridcell", "img", "tab", "listitem")
A11Y_PROPS = ("", "", " focused: True", " required: False", " expanded: False", " checked: false",
              " hasPopup: menu", " disabled: True")
LOGGERS = ("agentserve.engine.scheduler", "agentserve.gateway.app", "uvicorn.access", "agentserve.engine.kv",
           "urllib3.connectionpool", "asyncio", "agentserve.predictor")
SHELL_COMMANDS = ("ls -la {path}", "cat {path}", "grep -rn \"{word}\" src/ | head -n {k}", "git status",
                  "git log --oneline -n {k}", "python -m pytest -q tests/{word}", "wc -l {path}",
                  "find . -name '*.py' -newer {path}", "curl -s http://localhost:8000/v1/models | jq .",
                  "pip install -e '.[dev]'", "tail -n {k}0 /var/log/{word}.log", "df -h /")


def pick_text(rng: random.Random, template: str) -> str:
    return template.format(n=rng.randint(100_000, 999_999), k=rng.randint(2, 8), city=rng.choice(CITIES),
                           verb=rng.choice(VERBS), noun=rng.choice(WORDS), noun2=rng.choice(WORDS),
                           word=rng.choice(WORDS), path=a_path(rng))


def a_path(rng: random.Random) -> str:
    folder = rng.choice(("src", "tests", "app", "engine", "gateway", "docs", "scripts"))
    suffix = rng.choice((".py", ".json", ".md", ".yaml", ".sh"))
    return f"{folder}/{rng.choice(WORDS)}_{rng.choice(WORDS)}{suffix}"


def a_url(rng: random.Random) -> str:
    host = rng.choice(("shop.example.com", "gitlab.internal", "localhost:7770", "en.wikipedia.org"))
    return f"https://{host}/{rng.choice(WORDS)}/{rng.choice(WORDS)}/{rng.randint(1, 99999)}"


def timestamps(rng: random.Random) -> Iterator[datetime]:
    moment = datetime(2024, 1, 1) + timedelta(seconds=rng.randint(0, 300 * 86400))
    while True:
        moment += timedelta(milliseconds=rng.randint(1, 5000))
        yield moment


def search_tool(rng: random.Random) -> tuple[str, dict[str, object], object]:
    results = [{"title": f"{rng.choice(PRODUCTS)} - {rng.choice(WORDS).title()}", "url": a_url(rng),
                "snippet": pick_text(rng, rng.choice(THOUGHTS))} for _ in range(rng.randint(1, 3))]
    return "search_web", {"query": " ".join(rng.sample(WORDS, 3)), "max_results": 3}, {"results": results}


def shell_tool(rng: random.Random) -> tuple[str, dict[str, object], object]:
    command = pick_text(rng, rng.choice(SHELL_COMMANDS))
    return "run_shell", {"command": command, "timeout_s": 30}, {
        "exit_code": rng.choice((0, 0, 0, 1, 2)), "stdout": log_lines(rng, rng.randint(1, 4)), "stderr": ""}


def browser_tool(rng: random.Random) -> tuple[str, dict[str, object], object]:
    args: dict[str, object] = {"action": rng.choice(("click", "type", "scroll", "hover")),
                               "element_id": rng.randint(1, 2000)}
    if args["action"] == "type":
        args |= {"text": rng.choice(PRODUCTS), "press_enter": rng.random() < 0.5}
    return "browser", args, {"url": a_url(rng), "observation": a11y_tree(rng, rng.randint(3, 8))}


def sql_tool(rng: random.Random) -> tuple[str, dict[str, object], object]:
    limit = rng.randint(3, 6)
    query = (f"SELECT id, customer, total FROM orders WHERE created_at >= '2024-{rng.randint(1, 12):02d}-01' "
             f"ORDER BY total DESC LIMIT {limit}")
    rows = [[rng.randint(1, 99999), f"{rng.choice(WORDS)}@example.com", round(rng.uniform(5, 900), 2)]
            for _ in range(limit)]
    return "sql_query", {"query": query}, {"columns": ["id", "customer", "total"], "rows": rows}


def weather_tool(rng: random.Random) -> tuple[str, dict[str, object], object]:
    city = rng.choice(CITIES)
    days = [{"date": f"2024-06-{day:02d}", "high_c": round(rng.uniform(8, 31), 1),
             "rain_mm": rng.randint(0, 20)} for day in range(10, 13)]
    return "get_weather", {"city": city, "days": 3, "units": "metric"}, {"city": city, "forecast": days}


TOOLS: tuple[Callable[[random.Random], tuple[str, dict[str, object], object]], ...] = (
    search_tool, shell_tool, browser_tool, sql_tool, weather_tool)


def agent_session(rng: random.Random) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": pick_text(rng, rng.choice(TASKS))}]
    for _ in range(rng.randint(1, 4)):
        name, args, result = rng.choice(TOOLS)(rng)
        call_id = f"call_{rng.getrandbits(48):012x}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        thought = pick_text(rng, rng.choice(THOUGHTS))
        messages.append({"role": "assistant", "content": thought, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})
    messages.append({"role": "assistant", "content": "Done. " + pick_text(rng, rng.choice(THOUGHTS))})
    return rng.choice((render_request, render_chatml))(rng, messages)


def render_request(rng: random.Random, messages: list[dict[str, Any]]) -> str:
    body = {"model": "agentserve-tiny", "messages": messages, "max_tokens": rng.choice((64, 256, 1024)),
            "temperature": rng.choice((0.0, 0.2, 0.7)), "stream": rng.random() < 0.5}
    return json.dumps(body, indent=rng.choice((None, 2)), ensure_ascii=False)


def render_chatml(rng: random.Random, messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = str(message["content"])
        for call in message.get("tool_calls", []):
            function = call["function"]
            payload = {"name": function["name"], "arguments": json.loads(function["arguments"])}
            content += f"\n<tool_call>\n{json.dumps(payload)}\n</tool_call>"
        parts.append(f"<|im_start|>{message['role']}\n{content}<|im_end|>")
    return "\n".join(parts)


def a11y_tree(rng: random.Random, rows: int) -> str:
    lines = [f"RootWebArea '{rng.choice(PRODUCTS)} | {rng.choice(WORDS).title()}' focused: True"]
    node = rng.randint(1, 400)
    for _ in range(rows):
        node += rng.randint(1, 9)
        name = rng.choice((rng.choice(PRODUCTS), rng.choice(WORDS).title(), f"${rng.uniform(1, 500):.2f}"))
        indent = "\t" * rng.randint(1, 4)
        lines.append(f"{indent}[{node}] {rng.choice(A11Y_ROLES)} '{name}'{rng.choice(A11Y_PROPS)}")
    return "\n".join(lines)


def html_page(rng: random.Random) -> str:
    lines = ["<!DOCTYPE html>", '<html lang="en">', f"<head><title>{rng.choice(PRODUCTS)}</title></head>",
             "<body>", '  <form action="/search"><input type="text" name="q" aria-label="Search"></form>',
             '  <ul class="product-list">']
    for _ in range(rng.randint(2, 6)):
        lines.append(f'    <li class="item" data-id="{rng.randint(1, 9999)}"><a href="{a_url(rng)}">'
                     f'{rng.choice(PRODUCTS)}</a> <span class="price">${rng.uniform(2, 300):.2f}</span></li>')
    return "\n".join([*lines, "  </ul>", "</body>", "</html>"])


def web_page(rng: random.Random) -> str:
    return a11y_tree(rng, rng.randint(8, 30)) if rng.random() < 0.6 else html_page(rng)


def log_lines(rng: random.Random, count: int) -> str:
    clock = timestamps(rng)
    lines = []
    for _ in range(count):
        moment = next(clock)
        level = rng.choice(("INFO", "INFO", "DEBUG", "WARNING", "ERROR"))
        if rng.random() < 0.3:
            request = f'"POST /v1/chat/completions HTTP/1.1" {rng.choice((200, 200, 429, 500))}'
            size = rng.randint(80, 9000)
            lines.append(f"127.0.0.1 - - [{moment:%d/%b/%Y:%H:%M:%S} +0000] {request} {size}")
            continue
        fields = (f"session={rng.getrandbits(32):08x} step={rng.randint(1, 99999)} "
                  f"running={rng.randint(0, 64)} kv_usage={rng.random():.3f} "
                  f"latency_ms={rng.uniform(0.1, 900):.1f}")
        stamp = moment.isoformat(timespec="milliseconds")
        lines.append(f"{stamp}Z {level:<7} {rng.choice(LOGGERS)} {fields}")
    return "\n".join(lines)


def traceback_text(rng: random.Random) -> str:
    frames = [f'  File "/srv/agentserve/{a_path(rng)}", line {rng.randint(1, 900)}, in {rng.choice(VERBS)}\n'
              f"    result = self.{rng.choice(VERBS)}({rng.choice(WORDS)}, timeout={rng.randint(1, 60)})"
              for _ in range(rng.randint(1, 4))]
    error = rng.choice(("KeyError: 'session_id'", "TimeoutError: decode step exceeded 30s",
                        "ValueError: block hash mismatch", "ConnectionResetError: [Errno 104]"))
    return "\n".join(["Traceback (most recent call last):", *frames, error])


def shell_session(rng: random.Random) -> str:
    lines = [f"$ {pick_text(rng, rng.choice(SHELL_COMMANDS))}"]
    for _ in range(rng.randint(1, 5)):
        lines.append(rng.choice((
            f"-rw-r--r--  1 agent agent {rng.randint(10, 99999):>6} Jun {rng.randint(1, 30):>2} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {a_path(rng)}",
            f"{rng.getrandbits(28):07x} {rng.choice(VERBS).title()} {rng.choice(WORDS)} {rng.choice(WORDS)}",
            f"{a_path(rng)}:{rng.randint(1, 500)}: {rng.choice(WORDS)} = {rng.choice(VERBS)}()",
            f"{rng.randint(1, 200)} passed, {rng.randint(0, 3)} failed in {rng.uniform(0.1, 90):.2f}s",
        )))
    return "\n".join(lines)


def csv_table(rng: random.Random) -> str:
    rows = ["date,session_id,prompt_tokens,completion_tokens,ttft_ms,tpot_ms,cost_usd"]
    for day in range(rng.randint(3, 10)):
        tokens = f"{rng.randint(10, 32000)},{rng.randint(1, 2000)}"
        timings = f"{rng.uniform(5, 3000):.1f},{rng.uniform(5, 80):.2f},{rng.uniform(0, 2):.4f}"
        date = f"2024-{rng.randint(1, 12):02d}-{day + 1:02d}"
        rows.append(f"{date},{rng.getrandbits(32):08x},{tokens},{timings}")
    return "\n".join(rows)


def ops_text(rng: random.Random) -> str:
    maker = rng.choice((shell_session, traceback_text, csv_table, lambda r: log_lines(r, r.randint(3, 12))))
    return maker(rng)


def stdlib_docs() -> Iterator[str]:
    for name in DOC_MODULES:
        module = importlib.import_module(name)
        chunks = [f"Help on module {name}:\n\n{inspect.getdoc(module) or ''}\n"]
        for attr, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if inspect.isclass(obj) or inspect.isfunction(obj) else None
            if doc and not attr.startswith("_") and getattr(obj, "__module__", None) == module.__name__:
                chunks.append(f"{name}.{attr}\n    {doc}\n")
        yield clip("\n".join(chunks), DOC_CHARS_PER_MODULE)


def stdlib_code() -> Iterator[str]:
    for name in CODE_MODULES:
        yield f"# Lib/{name.replace('.', '/')}.py\n" + clip(inspect.getsource(importlib.import_module(name)),
                                                             CODE_CHARS_PER_MODULE)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0] + "\n"


def sampled(make: Callable[[random.Random], str], seed: int, size: int) -> Iterator[str]:
    rng = random.Random(seed)
    total = 0
    while total < size:
        text = make(rng)
        total += len(text)
        yield text


def write_generated_corpus(corpus_dir: Path) -> list[Path]:
    documents = {
        "generated_agent.txt": sampled(agent_session, SEED, 140_000),
        "generated_web.txt": sampled(web_page, SEED + 1, 60_000),
        "generated_ops.txt": sampled(ops_text, SEED + 2, 60_000),
        "generated_stdlib_docs.txt": stdlib_docs(),
        "generated_stdlib_code.txt": stdlib_code(),
    }
    corpus_dir.mkdir(parents=True, exist_ok=True)
    for name, texts in documents.items():
        (corpus_dir / name).write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    return [corpus_dir / name for name in documents]
