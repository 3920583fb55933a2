"""Traffic classes from configs/qos.yaml: DSCP marks, the opensm QoS lines, and what validation refuses."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from engine.config import CONFIGS_DIR
from engine.transport.qos import CONFIG_ENV, QosConfig, add_qos_arguments, load_qos_config, main_qos, render_opensm_qos

OPENSM_LINES = [
    "qos TRUE",
    "qos_max_vls 4",
    "qos_high_limit 240",
    "qos_vlarb_high 0:192,1:192,2:0,3:192",
    "qos_vlarb_low 0:192,1:192,2:64,3:192",
    "qos_sl2vl 0,1,2,3,3,3,3,3,3,3,3,3,3,3,3,3",
]


def shipped() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CONFIGS_DIR / "qos.yaml").read_text())
    return data


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_qos_arguments(parser)
    return parser.parse_args(argv)


def test_dscp_per_traffic_class() -> None:
    config = load_qos_config()
    dscp = {name: traffic.dscp for name, traffic in config.classes.items()}
    assert dscp == {"decode": 0x30, "control": 0x30, "kv": 0x22, "prefill": 0x22, "background": 0x00}
    assert config.traffic_class("decode").tos == 0xC0 and config.traffic_class("kv").tos == 0x88
    with pytest.raises(ValueError, match="not one of"):
        config.traffic_class("bulk")


def test_opensm_qos_lines() -> None:
    text = render_opensm_qos(load_qos_config())
    assert [line for line in text.splitlines() if not line.startswith("#")] == OPENSM_LINES
    assert "# VL0 decode, VL1 kv_sync, VL2 management, VL3 parameter_updates" in text


def test_sl2vl_puts_decode_kv_management_and_updates_on_their_lanes() -> None:
    table = load_qos_config().sl2vl()
    assert len(table) == 16 and table[:4] == [0, 1, 2, 3]


@pytest.mark.parametrize(("path", "value", "message"), [
    (("infiniband", "vlarb_high"), [192, 192, 0, 256], "0..255"),
    (("infiniband", "vlarb_low"), [1, 1, 1, 1, 1], "at most max_vls"),
    (("infiniband", "lanes"), {"decode": 0, "kv_sync": 1, "management": 2, "parameter_updates": 4}, "outside"),
    (("infiniband", "vlarb_low"), [192, 192, 0, 192], "starve"),
    (("infiniband", "max_vls"), 16, "less than or equal"),
    (("classes", "kv"), {"dscp": 0x22, "sl": 1, "lane": "bulk"}, "lane 'bulk'"),
    (("classes", "kv"), {"dscp": 64, "sl": 1, "lane": "kv_sync"}, "less than or equal"),
    (("classes", "kv"), {"dscp": 0x22, "sl": 0, "lane": "kv_sync"}, "SL0 is already"),
])
def test_invalid_configs_are_refused(path: tuple[str, str], value: object, message: str) -> None:
    data = shipped()
    data[path[0]][path[1]] = value
    with pytest.raises(ValidationError, match=message):
        QosConfig.model_validate(data)


def test_every_class_must_be_mapped() -> None:
    data = shipped()
    del data["classes"]["prefill"]
    with pytest.raises(ValidationError, match="not mapped"):
        QosConfig.model_validate(data)


def test_main_qos_prints_the_map_or_the_opensm_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_qos(parse(["--ib"])) == 0
    assert capsys.readouterr().out.splitlines()[-len(OPENSM_LINES):] == OPENSM_LINES
    assert main_qos(parse([])) == 0
    assert "kv           dscp 0x22  tos 0x88  sl 1  lane kv_sync" in capsys.readouterr().out


def test_another_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    data = shipped()
    data["infiniband"]["high_limit"] = 16
    path = tmp_path / "qos.yaml"
    path.write_text(yaml.safe_dump(data))
    main_qos(parse(["--ib", "--config", str(path)]))
    assert "qos_high_limit 16" in capsys.readouterr().out.splitlines()
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert load_qos_config().infiniband.high_limit == 16
