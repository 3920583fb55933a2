from __future__ import annotations

from pathlib import Path

import pytest

from engine.capacity.alerts import (
    DECODE_LATENCY,
    KV_HIT_RATIO,
    RETRANSMITS,
    AlertInputs,
    AlertMonitor,
    read_tcp_segments,
)
from engine.capacity.settings import CapacitySettings

SNMP_HEADER = ("Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets "
               "CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors")


def write_snmp(path: Path, out_segs: int, retrans_segs: int) -> None:
    path.write_text("Ip: Forwarding DefaultTTL\nIp: 2 64\n" + SNMP_HEADER +
                    f"\nTcp: 1 200 120000 -1 10 5 0 0 2 900 {out_segs} {retrans_segs} 0 3 0\n"
                    "Udp: InDatagrams NoPorts\nUdp: 1 2\n")


@pytest.fixture
def snmp(tmp_path: Path) -> Path:
    return tmp_path / "snmp"


def monitor(snmp: Path) -> AlertMonitor:
    return AlertMonitor(CapacitySettings(), snmp_path=snmp)


def test_decode_latency_fires_at_three_times_prefill_and_not_just_below(snmp: Path) -> None:
    alerts = monitor(snmp)
    assert alerts.evaluate(AlertInputs(decode_latency_s=0.299, prefill_latency_s=0.1), 1.0) == []
    [fired] = alerts.evaluate(AlertInputs(decode_latency_s=0.3, prefill_latency_s=0.1), 2.0)
    assert (fired.alert, fired.firing, fired.at) == (DECODE_LATENCY, True, 2.0)
    assert "add decode capacity" in fired.message and fired.value == pytest.approx(3.0)
    assert alerts.evaluate(AlertInputs(decode_latency_s=0.5, prefill_latency_s=0.1), 3.0) == []  # still active
    assert alerts.gauges() == {DECODE_LATENCY: 1, KV_HIT_RATIO: 0, RETRANSMITS: 0}
    assert alerts.evaluate(AlertInputs(), 4.0) == []  # nothing measured: left as it was
    [cleared] = alerts.evaluate(AlertInputs(decode_latency_s=0.2, prefill_latency_s=0.1), 5.0)
    assert (cleared.alert, cleared.firing) == (DECODE_LATENCY, False) and alerts.active == ()


def test_kv_hit_ratio_fires_at_sixty_percent_once_enough_queries(snmp: Path) -> None:
    alerts = monitor(snmp)
    assert alerts.evaluate(AlertInputs(prefix_cache_queries=999, prefix_cache_hits=0), 1.0) == []  # window filling
    [fired] = alerts.evaluate(AlertInputs(prefix_cache_queries=1000, prefix_cache_hits=600), 2.0)
    assert (fired.alert, fired.firing, fired.value) == (KV_HIT_RATIO, True, 0.6)
    assert "eviction policy struggling" in fired.message
    [cleared] = alerts.evaluate(AlertInputs(prefix_cache_queries=2000, prefix_cache_hits=1201), 3.0)  # 601/1000
    assert not cleared.firing
    assert monitor(snmp).evaluate(AlertInputs(prefix_cache_queries=1000, prefix_cache_hits=601), 1.0) == []


def test_kv_window_restarts_with_the_counters(snmp: Path) -> None:
    alerts = monitor(snmp)
    alerts.evaluate(AlertInputs(prefix_cache_queries=5000, prefix_cache_hits=5000), 1.0)
    assert alerts.evaluate(AlertInputs(prefix_cache_queries=400, prefix_cache_hits=0), 2.0) == []  # restarted
    assert alerts.evaluate(AlertInputs(prefix_cache_queries=1399, prefix_cache_hits=0), 3.0) == []
    [fired] = alerts.evaluate(AlertInputs(prefix_cache_queries=1400, prefix_cache_hits=0), 4.0)
    assert fired.value == 0.0


def test_retransmits_fire_at_a_tenth_of_a_percent_between_reads(snmp: Path) -> None:
    alerts = monitor(snmp)
    write_snmp(snmp, 10_000, 5)
    assert alerts.evaluate(AlertInputs(), 1.0) == []  # baseline
    write_snmp(snmp, 10_999, 6)
    assert alerts.evaluate(AlertInputs(), 2.0) == []  # 999 segments: window filling
    write_snmp(snmp, 11_000, 6)
    [fired] = alerts.evaluate(AlertInputs(), 3.0)
    assert (fired.alert, fired.firing, fired.value) == (RETRANSMITS, True, 0.001)
    assert "check QoS" in fired.message and alerts.gauges()[RETRANSMITS] == 1
    write_snmp(snmp, 12_001, 7)  # 1 in 1001: just below
    [cleared] = alerts.evaluate(AlertInputs(), 4.0)
    assert not cleared.firing and alerts.gauges()[RETRANSMITS] == 0


def test_no_snmp_file_means_the_retransmit_alert_is_not_evaluated(snmp: Path) -> None:
    alerts = monitor(snmp)
    for now in (1.0, 2.0):
        assert alerts.evaluate(AlertInputs(), now) == []
    assert RETRANSMITS not in alerts.values
    snmp.write_text("Ip: Forwarding\nIp: 1\n")
    assert read_tcp_segments(snmp) is None


def test_the_real_snmp_file_parses() -> None:
    real = Path("/proc/net/snmp")
    if not real.exists():
        pytest.skip("no /proc/net/snmp on this system")
    segments = read_tcp_segments(real)
    assert segments is not None and segments.out_segs >= segments.retrans_segs >= 0
