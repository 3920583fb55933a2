"""Traffic classes: DSCP marks for IP sockets and the InfiniBand QoS (SL to VL, VL arbitration) of opensm.

`configs/qos.yaml` maps each class (decode, control, kv, prefill, background) to a DSCP code point, an
InfiniBand service level and a virtual lane. `render_opensm_qos` writes the `qos_*` lines of an
opensm.conf; `agentserve qos --ib` prints them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.config import CONFIGS_DIR

NUM_SLS = 16
OPENSM_MAX_VLS = 15
CONFIG_ENV = "AGENTSERVE_QOS_CONFIG"
REQUIRED_CLASSES = ("decode", "control", "kv", "prefill", "background")


class TrafficClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dscp: int = Field(ge=0, le=63)
    sl: int = Field(ge=0, lt=NUM_SLS)
    lane: str

    @property
    def tos(self) -> int:
        """The IP_TOS byte: DSCP in the upper six bits, ECN bits clear."""
        return self.dscp << 2


class InfinibandQos(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_vls: int = Field(ge=1, le=OPENSM_MAX_VLS)
    high_limit: int = Field(ge=0, le=255)
    lanes: dict[str, int]  # lane name -> VL
    vlarb_high: list[int]  # index = VL
    vlarb_low: list[int]
    unused_sl_lane: str

    @model_validator(mode="after")
    def _check(self) -> Self:
        for table in (self.vlarb_high, self.vlarb_low):
            if len(table) > self.max_vls or any(not 0 <= weight <= 255 for weight in table):
                raise ValueError(f"VL arbitration {table}: at most max_vls={self.max_vls} weights of 0..255")
        for lane, vl in self.lanes.items():
            if not 0 <= vl < self.max_vls:
                raise ValueError(f"lane {lane!r} on VL{vl}, outside the {self.max_vls} VLs of max_vls")
            if self.weight(vl) == 0:
                raise ValueError(f"lane {lane!r} (VL{vl}) has weight 0 in both arbitration tables: it would starve")
        self.vl(self.unused_sl_lane)
        return self

    def weight(self, vl: int) -> int:
        return sum(table[vl] for table in (self.vlarb_high, self.vlarb_low) if vl < len(table))

    def vl(self, lane: str) -> int:
        if lane not in self.lanes:
            raise ValueError(f"lane {lane!r} is not one of {sorted(self.lanes)}")
        return self.lanes[lane]


class QosConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: dict[str, TrafficClass]
    infiniband: InfinibandQos

    @model_validator(mode="after")
    def _check(self) -> Self:
        missing = [name for name in REQUIRED_CLASSES if name not in self.classes]
        if missing:
            raise ValueError(f"traffic classes {missing} are not mapped")
        sl_lanes: dict[int, str] = {}
        for name, traffic in self.classes.items():
            self.infiniband.vl(traffic.lane)
            if sl_lanes.setdefault(traffic.sl, traffic.lane) != traffic.lane:
                raise ValueError(f"class {name!r}: SL{traffic.sl} is already on lane {sl_lanes[traffic.sl]!r}")
        return self

    def traffic_class(self, name: str) -> TrafficClass:
        if name not in self.classes:
            raise ValueError(f"traffic class {name!r} is not one of {sorted(self.classes)}")
        return self.classes[name]

    def sl2vl(self) -> list[int]:
        table = [self.infiniband.vl(self.infiniband.unused_sl_lane)] * NUM_SLS
        for traffic in self.classes.values():
            table[traffic.sl] = self.infiniband.vl(traffic.lane)
        return table


def default_config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV, str(CONFIGS_DIR / "qos.yaml")))


def load_qos_config(path: Path | str | None = None) -> QosConfig:
    return QosConfig.model_validate(yaml.safe_load(Path(path or default_config_path()).read_text()))


def _vlarb(weights: list[int]) -> str:
    return ",".join(f"{vl}:{weight}" for vl, weight in enumerate(weights))


def _comments(config: QosConfig) -> list[str]:
    ib = config.infiniband
    lanes = ", ".join(f"VL{vl} {lane}" for lane, vl in sorted(ib.lanes.items(), key=lambda item: item[1]))
    by_sl: dict[int, list[str]] = {}
    for name, traffic in config.classes.items():
        by_sl.setdefault(traffic.sl, []).append(name)
    sls = "; ".join(f"SL{sl} {', '.join(names)} -> VL{config.sl2vl()[sl]}" for sl, names in sorted(by_sl.items()))
    return ["# agentserve InfiniBand QoS (opensm.conf), from the traffic classes of qos.yaml",
            f"# {lanes}", f"# {sls}; other SLs -> VL{ib.vl(ib.unused_sl_lane)} ({ib.unused_sl_lane})"]


def render_opensm_qos(config: QosConfig) -> str:
    ib = config.infiniband
    lines = [*_comments(config), "qos TRUE", f"qos_max_vls {ib.max_vls}", f"qos_high_limit {ib.high_limit}",
             f"qos_vlarb_high {_vlarb(ib.vlarb_high)}", f"qos_vlarb_low {_vlarb(ib.vlarb_low)}",
             f"qos_sl2vl {','.join(str(vl) for vl in config.sl2vl())}"]
    return "\n".join(lines) + "\n"


def render_dscp_table(config: QosConfig) -> str:
    rows = [f"{name:<12} dscp 0x{c.dscp:02x}  tos 0x{c.tos:02x}  sl {c.sl}  lane {c.lane}"
            for name, c in config.classes.items()]
    return "\n".join(rows) + "\n"


def add_qos_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ib", action="store_true", help="print the opensm.conf QoS section")
    parser.add_argument("--config", type=Path, default=None, help=f"QoS YAML (default: ${CONFIG_ENV} or "
                        "configs/qos.yaml)")


def main_qos(args: argparse.Namespace) -> int:
    """`agentserve qos [--ib] [--config FILE]`: the DSCP map, or with --ib the opensm QoS lines."""
    config = load_qos_config(args.config)
    print(render_opensm_qos(config) if args.ib else render_dscp_table(config), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("qos", help="traffic classes from configs/qos.yaml: DSCP marks, InfiniBand opensm QoS")
    add_qos_arguments(p)
    p.set_defaults(run=lambda args: sys.exit(main_qos(args)))
