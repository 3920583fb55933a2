"""The structured-outputs benchmark end to end on the tiny model (random weights: only the grammar makes its
replies valid), through the CLI: its seeded tasks, its report and the goals list every report carries."""

from __future__ import annotations

import json
from pathlib import Path

from agents_eval.bench.structured.measure import calls_valid, object_valid
from agents_eval.bench.structured.tasks import agent_tasks, schema_tasks
from agentserve.cli import main


def test_tasks_are_seeded_and_offer_one_to_four_tools() -> None:
    tasks = agent_tasks(30, seed=3)
    assert tasks == agent_tasks(30, seed=3) and tasks != agent_tasks(30, seed=4)
    assert {len(t.tools) for t in tasks} <= {1, 2, 3, 4} and len({len(t.tools) for t in tasks}) > 1
    schemas = schema_tasks(6, seed=3)
    assert [list(s.model.model_json_schema()["properties"]) for s in schemas] == \
        [list(s.model.model_json_schema()["properties"]) for s in schema_tasks(6, seed=3)]


def test_the_validity_checks_take_valid_replies_only() -> None:
    [task] = [t for t in agent_tasks(20, seed=0) if "read_file" in t.tools][:1]
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "a.txt", "lines": 5}}</tool_call>'
    assert calls_valid(call, task)
    assert not calls_valid(call.replace('"lines": 5', '"lines": "five"'), task)
    assert not calls_valid("I would run ls.", task)
    schema = schema_tasks(1, seed=0)[0]
    assert not object_valid("{}", schema)


def test_bench_writes_its_report_with_goals(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "structured"
    main(["bench", "structured", "--out", str(out), "--model", "tiny", "--tasks", "3", "--schemas", "2",
          "--cost-requests", "2", "--max-tokens", "48"])
    data = json.loads((out / "report.json").read_text())
    assert {g["name"] for g in data["goals"]} >= {"tool_calls_valid_share_required", "json_schema_valid_share"}
    assert all(set(g) == {"name", "target", "bound", "measured", "met"} for g in data["goals"])
    validity = data["figures"]["validity"]  # random weights: strings run on to max_tokens, so not all are whole
    assert all(s.startswith('"<tool_call>{\\"name\\": ') for s in validity["tool_calls_required"]["samples"])
    assert validity["tool_calls_unconstrained"]["valid_share"] == 0.0
    cost = data["figures"]["cost"]
    assert cost["batch_1"]["forced_tokens"] > 0 and cost["batch_many"]["batch_size"] == 2
    assert cost["batch_1"]["jump_forward_steps"] < cost["batch_1"]["plain_constrained_steps"]
    assert (out / "report.md").exists() and (out / "validity.png").exists()
