"""The one way a stack config is read: from a stack file (the submitter, the offline plan, tests) or from the
config map the Pulumi CLI hands the program. Errors name the file, the field and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainforge import errors, yamlfile
from trainforge.stackconfig.platform import PlatformConfig

CONFIG_KEY = "trainforge:platform"
TEAM_CONFIG_KEY = "trainforge:team"  # a team stack's one key (team_stacks.py)
TEAM_STACK_NAMING = ("team stack files are named Pulumi.<env>.team-<team>.yaml (the team's name in lower-case letters, digits "
                     "and hyphens)")
STACK_FILE_PATTERN = re.compile(r"^Pulumi\.(?P<env>[a-z0-9][a-z0-9-]*)\.yaml$")


def stack_file_name(stack: str) -> str:
    """The file Pulumi reads stack `stack`'s config from (`prod` -> Pulumi.prod.yaml; a glob works too)."""
    return f"Pulumi.{stack}.yaml"


class ConfigError(errors.TrainforgeError):
    """A stack configuration that must not reach the cloud. str() is the whole user-facing message."""

    def _message(self) -> str:
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"{self._heading()}:\n{lines}"

    def _heading(self) -> str:
        """What is invalid, before the list of problems (the kinds of stack configuration differ only here)."""
        return f"invalid trainforge configuration in {self.source} ({CONFIG_KEY})"


STACK_FIXES = {
    "missing": " Fix: add this field to the stack file.",
    "extra_forbidden": " Fix: remove it or correct its spelling (see src/trainforge/stackconfig/ for the fields).",
}


def stack_path(stack: str, stacks_dir: Path = Path("stacks")) -> Path:
    """A stack name (`prod` -> stacks/Pulumi.prod.yaml) or a stack file's path."""
    path = Path(stack)
    return path if path.suffix in (".yaml", ".yml") or path.exists() else stacks_dir / stack_file_name(stack)


def parse(raw: Any, *, environment: str, source: str) -> PlatformConfig:
    """Validate the `trainforge:platform` object of a stack; the stack name is the environment."""
    if not isinstance(raw, dict):
        raise ConfigError(source, [f"{CONFIG_KEY} must be a mapping of fields, got {type(raw).__name__}. Fix: see stacks/Pulumi.dev.yaml"])
    declared = raw.get("environment")
    if declared is not None and declared != environment:
        raise ConfigError(source, [f"environment: {declared!r} does not match the stack name {environment!r}. Fix: remove it (the stack name is used) or rename the stack"])
    try:
        return PlatformConfig.model_validate({**raw, "environment": environment})
    except ValidationError as exc:
        raise ConfigError(source, errors.problems(exc, STACK_FIXES)) from None




@dataclass(frozen=True)
class StackFile:
    """A stack file as the Pulumi CLI reads it: the stack (= environment) name and its `config:` map."""

    path: Path
    environment: str
    config: dict[str, Any]


def read_stack_file(path: str | Path) -> StackFile:
    path = Path(path)
    match = STACK_FILE_PATTERN.match(path.name)
    if match is None:
        if ".team" in path.name:  # meant as a team stack file (those are read by team_stacks.py), misnamed
            raise ConfigError(str(path), [f"{TEAM_STACK_NAMING}, got {path.name!r}. Fix: rename the file"])
        raise ConfigError(str(path), [f"stack files are named Pulumi.<env>.yaml, got {path.name!r}. Fix: --stack stacks/Pulumi.<env>.yaml "
                                      "(the environment is read from the name)"])
    return StackFile(path, match["env"], read_config_map(path, ConfigError, "--stack stacks/Pulumi.<env>.yaml"))


def read_config_map(path: Path, error: type[ConfigError], usage: str) -> dict[str, Any]:
    """A stack file's `config:` map, as the Pulumi CLI reads it; `error` names what kind of stack file it is."""
    try:
        document = yamlfile.read(path) or {}
    except FileNotFoundError:
        raise error(str(path), [f"no such stack file. Fix: {usage}"]) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise error(str(path), [yamlfile.describe(exc)]) from None
    if not isinstance(document, dict):
        raise error(str(path), ["a stack file is a mapping with a config: key. Fix: see stacks/Pulumi.dev.yaml"])
    return document.get("config") or {}


def from_config_map(config: dict[str, Any], *, environment: str, source: str) -> PlatformConfig:
    """The stack's typed config from its `config:` map (a stack file's, or the one the Pulumi CLI hands the program)."""
    raw = config.get(CONFIG_KEY)
    if raw is None and TEAM_CONFIG_KEY in config:
        raise ConfigError(source, [f"this file declares a team ({TEAM_CONFIG_KEY}) but is named like a platform stack file: "
                                   f"{TEAM_STACK_NAMING}. Fix: rename the file"])
    if raw is None:
        raise ConfigError(source, [f"no {CONFIG_KEY} key under config:. Fix: copy the block from stacks/Pulumi.dev.yaml"])
    return parse(raw, environment=environment, source=source)


def stack_files(stacks_dir: str | Path) -> list[Path]:
    return sorted(p for p in Path(stacks_dir).iterdir() if STACK_FILE_PATTERN.match(p.name))
