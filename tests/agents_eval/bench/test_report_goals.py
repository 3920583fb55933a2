"""Every benchmark that writes a `report.json` puts the common `goals` list in it (harness `goal()` objects,
which `write_report` checks): read from the benches' sources, so a new bench cannot leave it out unseen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import agents_eval.bench

BENCH_ROOT = Path(agents_eval.bench.__file__).parent
WRITES_REPORT = re.compile(r"\bwrite_report\(|\bJSON_NAME\b")
GOALS_KEY = re.compile(r"""["']goals["']\s*[\]:]""")


def _sources(folder: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(folder.rglob("*.py")))


BENCHES = sorted(path.name for path in BENCH_ROOT.iterdir()
                 if path.is_dir() and WRITES_REPORT.search(_sources(path)))


def test_the_walk_finds_the_benches() -> None:
    assert {"kv_cache", "capacity", "overload", "soak", "agent", "quality"} <= set(BENCHES)


@pytest.mark.parametrize("bench", BENCHES)
def test_every_report_carries_a_goals_list(bench: str) -> None:
    assert GOALS_KEY.search(_sources(BENCH_ROOT / bench)), f"agents_eval/bench/{bench} writes no goals list"
