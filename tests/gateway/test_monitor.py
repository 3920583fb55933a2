"""`agentserve monitor --once` against a real HTTP server serving a fixed Prometheus text."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console

from agentserve.cli import main
from gateway.monitor import parse_interval, parse_metrics, render
from tests.conftest import free_port

METRICS = """\
# HELP agentserve:num_requests_running Requests the engine is running.
# TYPE agentserve:num_requests_running gauge
agentserve:num_requests_running 3.0
# HELP agentserve:prefix_cache_queries_total Tokens looked up in the prefix cache.
# TYPE agentserve:prefix_cache_queries_total counter
agentserve:prefix_cache_queries_total 1000.0
# HELP agentserve:prefix_cache_hits_total Tokens found in the prefix cache.
# TYPE agentserve:prefix_cache_hits_total counter
agentserve:prefix_cache_hits_total 750.0
# HELP agentserve:requests_total Finished requests.
# TYPE agentserve:requests_total counter
agentserve:requests_total{endpoint="chat",finish_reason="stop"} 12.0
agentserve:requests_total{endpoint="responses",finish_reason="length"} 5.0
# HELP agentserve:time_to_first_token_seconds Time to first token.
# TYPE agentserve:time_to_first_token_seconds histogram
agentserve:time_to_first_token_seconds_bucket{le="0.1"} 2.0
agentserve:time_to_first_token_seconds_bucket{le="+Inf"} 4.0
agentserve:time_to_first_token_seconds_count 4.0
agentserve:time_to_first_token_seconds_sum 0.5
# HELP agentserve:num_workers Engine workers by role.
# TYPE agentserve:num_workers gauge
agentserve:num_workers{role="prefill"} 1.0
agentserve:num_workers{role="decode"} 3.0
# HELP agentserve:capacity_alert Capacity alerts, 1 while firing.
# TYPE agentserve:capacity_alert gauge
agentserve:capacity_alert{alert="decode_latency"} 0.0
agentserve:capacity_alert{alert="kv_hit_ratio"} 1.0
agentserve:capacity_alert{alert="retransmits"} 0.0
"""


class MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = METRICS.encode() if self.path == "/metrics" else b"not found"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), MetricsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def monitor_once(capsys: pytest.CaptureFixture[str], url: str, metric: str) -> list[str]:
    main(["monitor", "--metric", metric, "--url", url, "--once"])
    return capsys.readouterr().out.splitlines()


def row(lines: list[str], name: str) -> list[str]:
    [line] = [line for line in lines if f" {name} " in line]
    return line.replace("│", " ").split()


def test_derived_hit_ratio_with_roles_and_alerts(capsys: pytest.CaptureFixture[str], url: str) -> None:
    lines = monitor_once(capsys, url, "kvcache_hit_ratio")
    assert row(lines, "kvcache_hit_ratio") == ["kvcache_hit_ratio", "0.75"]
    assert "workers: decode 3, prefill 1" in lines
    assert "alerts: kv_hit_ratio" in lines


@pytest.mark.parametrize("metric", ["num_requests_running", "agentserve:num_requests_running"])
def test_a_gauge_with_or_without_the_prefix(capsys: pytest.CaptureFixture[str], url: str, metric: str) -> None:
    assert row(monitor_once(capsys, url, metric), "agentserve:num_requests_running")[-1] == "3"


def test_labelled_counters_and_histograms(capsys: pytest.CaptureFixture[str], url: str) -> None:
    lines = monitor_once(capsys, url, "requests_total")
    assert row(lines, 'agentserve:requests_total{endpoint="chat",finish_reason="stop"}')[-1] == "12"
    assert row(lines, 'agentserve:requests_total{endpoint="responses",finish_reason="length"}')[-1] == "5"
    lines = monitor_once(capsys, url, "time_to_first_token_seconds")
    assert row(lines, "agentserve:time_to_first_token_seconds_count")[-1] == "4"
    assert row(lines, "agentserve:time_to_first_token_seconds_sum")[-1] == "0.5"
    assert row(lines, "agentserve:time_to_first_token_seconds_mean")[-1] == "0.125"


def test_unknown_metric_and_unreachable_server_exit_2(capsys: pytest.CaptureFixture[str], url: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["monitor", "--metric", "no_such_metric", "--url", url, "--once"])
    assert exit_info.value.code == 2
    assert "unknown metric 'no_such_metric'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["monitor", "--metric", "num_requests_running", "--url", f"http://127.0.0.1:{free_port()}", "--once"])
    assert exit_info.value.code == 2 and "cannot read" in capsys.readouterr().err


def test_rates_between_two_scrapes() -> None:
    before = parse_metrics(METRICS)
    after = parse_metrics(METRICS.replace("agentserve:prefix_cache_hits_total 750.0",
                                          "agentserve:prefix_cache_hits_total 950.0"))
    console = Console(width=160, file=io.StringIO(), record=True)
    console.print(render(after, "prefix_cache_hits_total", before, elapsed_s=2.0))
    lines = console.export_text().splitlines()
    assert row(lines, "agentserve:prefix_cache_hits_total")[-2:] == ["950", "100"]


@pytest.mark.parametrize("text, seconds", [("1s", 1.0), ("500ms", 0.5), ("2", 2.0), ("0.25s", 0.25)])
def test_intervals_parse(text: str, seconds: float) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["fast", "0s", "-1s", "1m", ""])
def test_bad_intervals_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="interval"):
        parse_interval(text)
