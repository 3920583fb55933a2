"""`write_report` and the goals list every report carries: `{name, target, bound, measured, met}`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agents_eval.harness.report import GOAL_KEYS, Table, goal, write_report


def test_a_goal_is_met_on_its_side_of_the_target_and_never_without_a_measurement() -> None:
    assert goal("x", 1.35, "min", 1.4)["met"] and not goal("x", 1.35, "min", 1.3)["met"]
    assert goal("p99", 0.2, "max", 0.2)["met"] and not goal("p99", 0.2, "max", 0.21)["met"]
    assert not goal("x", 1.0, "min", None)["met"] and not goal("x", 1.0, "min", math.nan)["met"]
    assert tuple(goal("x", 1.0, "min", 2.0, against="baseline"))[:5] == GOAL_KEYS
    with pytest.raises(ValueError, match="bound"):
        goal("x", 1.0, "above", 2.0)


def test_the_report_keeps_a_goals_list_and_refuses_one_of_another_shape(tmp_path: Path) -> None:
    goals = [goal("agent/baseline throughput", 5.0, "min", math.inf, config="agent")]
    files = write_report(tmp_path, {"goals": goals}, "t", [Table("t", ["a"], [["1"]])], None)
    saved = json.loads(files.json.read_text())["goals"]
    assert saved == [{"name": "agent/baseline throughput", "target": 5.0, "bound": "min", "measured": None,
                      "met": True, "config": "agent"}]  # infinity is not JSON: null, the verdict kept
    with pytest.raises(ValueError, match="misses"):
        write_report(tmp_path, {"goals": [{"figure": "lost", "goal": 0, "met": True}]}, "t", [], None)
