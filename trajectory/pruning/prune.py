"""Token pruning on ingest: an observation (`trajectory.observations`) is pruned once, when it enters the
session, so the history stays append-only and its cached KV stays valid. Rules live in `pruning_rules`; this
module holds the per-role and per-tool configuration (`configs/pruning.yaml`) and the `prune` entry point."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from trajectory.observations import ObservationUsers
from trajectory.pruning.rules import RULE_NAMES, PruningRules, parses_as_json, prune_lines

OBSERVATION_ROLE = "tool"  # observations, user-message ones included, are pruned under this role's rules
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "pruning.yaml"

RuleOverrides = dict[str, Any]


@dataclass(frozen=True)
class PruneResult:
    """The pruned text, its token counts, and per rule what was removed (see `PruningRules` for units)."""

    text: str
    tokens_before: int
    tokens_after: int
    removed: dict[str, int]


class PruningConfig(BaseModel):
    """Rules for a message: `defaults`, then the overrides for its role, then those for its tool. Roles in
    `unpruned_roles` are never pruned, whatever the overrides; an observation is pruned as `OBSERVATION_ROLE`.
    `observation_users` is the rule that makes a user message an observation (`trajectory.observations`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unpruned_roles: frozenset[str] = frozenset({"system", "user"})
    observation_users: ObservationUsers = "never"
    defaults: PruningRules = Field(default_factory=PruningRules)
    roles: dict[str, RuleOverrides] = Field(default_factory=dict)
    tools: dict[str, RuleOverrides] = Field(default_factory=dict)
    _rules: dict[tuple[str, str | None], PruningRules] = PrivateAttr(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None = None) -> PruningConfig:
        """The config in `path`, by default `configs/pruning.yaml`; an unknown key is a ValidationError."""
        data = yaml.safe_load((path or DEFAULT_CONFIG_PATH).read_text())
        return cls.model_validate(data or {})

    @model_validator(mode="after")
    def _overrides_are_rules(self) -> PruningConfig:
        for section, overrides in (("roles", self.roles), ("tools", self.tools)):
            for name, override in overrides.items():
                try:
                    _merged(self.defaults, override)
                except ValueError as error:
                    raise ValueError(f"{section}.{name}: {error}") from error
        return self

    def rules_for(self, role: str, tool: str | None) -> PruningRules:
        """The rules for a message of `role`, produced by `tool` when it is a tool result; merged (and their
        patterns compiled) once per role and tool."""
        rules = self._rules.get((role, tool))
        if rules is None:
            overrides = [self.roles.get(role, {}), self.tools.get(tool, {}) if tool is not None else {}]
            if role in self.unpruned_roles:
                overrides.append({"enabled": False})
            rules = self._rules[role, tool] = _merged(self.defaults, *overrides)
        return rules


def _merged(defaults: PruningRules, *overrides: RuleOverrides) -> PruningRules:
    merged = defaults.model_dump()
    for override in overrides:
        merged |= override
    return PruningRules.model_validate(merged)


def prune(text: str, role: str, tool: str | None, config: PruningConfig,
          count_tokens: Callable[[str], int]) -> PruneResult:
    """`text` without what carries no information for the model. Fenced code blocks, JSON and the roles in
    `config.unpruned_roles` stay byte-identical; pruning is deterministic and `prune(prune(x)) == prune(x)`."""
    tokens_before = count_tokens(text)
    rules = config.rules_for(role, tool)
    if not rules.enabled or parses_as_json(text):
        return PruneResult(text, tokens_before, tokens_before, dict.fromkeys(RULE_NAMES, 0))
    pruned, removed = prune_lines(text, rules)
    tokens_after = count_tokens(pruned)
    if tokens_after > tokens_before:  # a marker can cost more tokens than the lines it replaced: keep the text
        return PruneResult(text, tokens_before, tokens_before, dict.fromkeys(RULE_NAMES, 0))
    return PruneResult(pruned, tokens_before, tokens_after, removed)
