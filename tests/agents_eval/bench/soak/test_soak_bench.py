"""A short soak (`agentserve bench soak`) on a real gateway process: sessions keep arriving and expiring;
open descriptors do not grow, the sessions held stay bounded by the TTL, and the report has its slopes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.soak.cli import run_soak, write
from agents_eval.bench.soak.soak import FDS_GROWTH_BOUND, RSS_GROWTH_BOUND_MB, SoakSettings

pytestmark = pytest.mark.slow


def test_a_short_soak_stays_flat(tmp_path: Path) -> None:
    settings = SoakSettings(duration_s=40.0, sessions_per_s=1.0, turns=2, max_tokens=4, sample_s=4.0,
                            session_ttl_s=6.0)
    result = run_soak("tiny", settings, tmp_path, quiet=True)
    assert result.completed == result.turns >= 20
    after_warmup = result.samples[len(result.samples) // 4:]
    assert max(s.fds for s in after_warmup) <= after_warmup[0].fds + FDS_GROWTH_BOUND  # none pile up
    # sessions expire: at most those started within the TTL (plus their turns) are held
    assert max(s.sessions for s in result.samples) <= settings.sessions_per_s * 3 * (settings.session_ttl_s + 10)
    files = write(tmp_path / "report", settings, result, 1.0)
    slopes = json.loads(files.json.read_text())["slopes_per_hour"]
    window_h = result.window_h()  # the slopes' window: the samples after the warm-up
    assert window_h > 0
    # flat: over the window the fitted lines add at most the stated bounds (descriptors, MB)
    assert slopes["fds_per_h"] * window_h <= FDS_GROWTH_BOUND, (slopes, window_h)
    assert slopes["rss_mb_per_h"] * window_h <= RSS_GROWTH_BOUND_MB, (slopes, window_h)
    assert isinstance(slopes["turn_p50_ms_per_h"], float), slopes
