"""Team stacks: a team declared in its own stack, `stacks/Pulumi.<env>.team-<team>.yaml` (stack `<env>.team-<team>`),
next to the platform stack `stacks/Pulumi.<env>.yaml` it builds on. Onboarding or changing a team is an update of its
own stack (its IAM role, access entries, namespace, queues, RBAC, volumes, budget) that reads the platform stack's
outputs through a StackReference; the platform stack keeps only the shared pieces.

A team is the same `TeamConfig` wherever it is declared. The cohort is every team of the platform, those listed in the
platform stack's `teams:` and those in team stack files: the rules that span teams (one name, one principal, the sum of
quotas within the node groups' capacity) are checked over all of them, by the platform program, the team program, the
submitter and `plan` alike, from the stack files of the same checkout (the reviewed source of which teams exist).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainforge import errors
from trainforge.stackconfig.loader import (STACK_FIXES, stack_file_name, TEAM_CONFIG_KEY, TEAM_STACK_NAMING, ConfigError, StackFile, from_config_map,
                                          read_config_map, read_stack_file)
from trainforge.stackconfig.platform import PlatformConfig, team_problems
from trainforge.stackconfig.teams import TeamConfig


class TeamConfigError(ConfigError):
    """A team stack's `trainforge:team` that must not reach the cloud."""

    def _heading(self) -> str:
        return f"invalid trainforge team stack {self.source} ({TEAM_CONFIG_KEY})"


TEAM_STACK_FILE_PATTERN = re.compile(r"^Pulumi\.(?P<env>[a-z0-9][a-z0-9-]*)\.team-(?P<team>[a-z0-9][a-z0-9-]*)\.yaml$")
TEAM_STACK_MARK = ".team-"


def team_stack_name(environment: str, team: str) -> str:
    return f"{environment}{TEAM_STACK_MARK}{team}"


def split_stack_name(stack: str) -> tuple[str, str | None]:
    """`prod` -> ('prod', None); `prod.team-vision` -> ('prod', 'vision')."""
    environment, mark, team = stack.partition(TEAM_STACK_MARK)
    return (environment, team) if mark else (stack, None)


def is_team_stack_file(path: str | Path) -> bool:
    return TEAM_STACK_FILE_PATTERN.match(Path(path).name) is not None


class CohortError(ConfigError):
    """Teams that do not fit together, declared across a platform stack file and its team stack files."""

    def _heading(self) -> str:
        return f"the teams of platform stack {self.source} and of its team stack files do not fit together"


@dataclass(frozen=True)
class TeamStack:
    """One team stack file: the platform environment it belongs to and the team it declares."""

    path: Path
    environment: str
    team: TeamConfig
    config: dict[str, Any]  # the file's `config:` map, as the Pulumi CLI hands it to the program

    @property
    def stack(self) -> str:
        return team_stack_name(self.environment, self.team.name)

    @property
    def platform_path(self) -> Path:
        return self.path.parent / stack_file_name(self.environment)


def parse_team(raw: Any, *, team: str, source: str) -> TeamConfig:
    """Validate the `trainforge:team` object of a team stack; the stack name names the team."""
    if not isinstance(raw, dict):
        raise TeamConfigError(source, [f"{TEAM_CONFIG_KEY} must be a mapping of a team's fields (cost_centre, gpu_quota, "
                                       f"monthly_budget_usd, members, ...), got {type(raw).__name__}. Fix: see stacks/Pulumi.dev.team-audio.yaml"])
    declared = raw.get("name", team)
    if declared != team:
        raise TeamConfigError(source, [f"{TEAM_CONFIG_KEY}.name: {declared!r} does not match the stack's team {team!r} "
                                   f"(the file is named for it). Fix: name: {team}, or rename the file"])
    try:
        return TeamConfig.model_validate({**raw, "name": team})
    except ValidationError as exc:
        raise TeamConfigError(source, [f"{TEAM_CONFIG_KEY}.{p}" for p in errors.problems(exc, STACK_FIXES)]) from None


def team_from_config_map(config: dict[str, Any], *, stack: str, source: str) -> TeamConfig:
    """The team of team stack `stack` (`<env>.team-<team>`) from its `config:` map (a file's, or the Pulumi CLI's)."""
    _, team = split_stack_name(stack)
    if team is None:
        raise TeamConfigError(source, [f"stack {stack!r} has a {TEAM_CONFIG_KEY} key, but team stacks are named <env>.team-<team> "
                                       "(lower-case letters, digits and hyphens). Fix: `pulumi stack init <env>.team-<team>` with the "
                                       "file renamed to match, or move the team into the platform stack's teams:"])
    raw = config.get(TEAM_CONFIG_KEY)
    if raw is None:
        raise TeamConfigError(source, [f"no {TEAM_CONFIG_KEY} key under config:. Fix: a team stack declares its team there "
                                       "(see stacks/Pulumi.dev.team-audio.yaml)"])
    return parse_team(raw, team=team, source=source)


def read_team_stack_file(path: str | Path) -> TeamStack:
    path = Path(path)
    match = TEAM_STACK_FILE_PATTERN.match(path.name)
    if match is None:
        raise TeamConfigError(str(path), [f"{TEAM_STACK_NAMING}, got {path.name!r}. Fix: rename the file"])
    config = read_config_map(path, TeamConfigError, "--stack stacks/Pulumi.<env>.team-<team>.yaml")
    strays = sorted(k for k in config if k.startswith("trainforge:") and k != TEAM_CONFIG_KEY)
    if strays:
        raise TeamConfigError(str(path), [f"{strays}: a team stack holds only {TEAM_CONFIG_KEY} (the platform's settings live in "
                                      f"{stack_file_name(match['env'])}). Fix: remove them"])
    team = team_from_config_map(config, stack=team_stack_name(match["env"], match["team"]), source=str(path))
    return TeamStack(path, match["env"], team, config)


def team_stack_files(stacks_dir: str | Path, environment: str) -> list[Path]:
    """The platform's team stack files. A file that looks like one of this platform's stacks but is named like neither
    kind is refused: left out silently, its team's quota would escape the cohort's check."""
    found = sorted(Path(stacks_dir).glob(stack_file_name(f"{environment}.*")))
    strays = [p.name for p in found if not is_team_stack_file(p)]
    if strays:
        raise TeamConfigError(str(Path(stacks_dir)), [f"{strays} are named like neither a platform stack (Pulumi.<env>.yaml) nor a team "
                                                      "stack (Pulumi.<env>.team-<team>.yaml, lower-case team). Fix: rename them"])
    return found


@dataclass(frozen=True)
class Cohort:
    """A platform and every team it serves: `platform.teams` are the teams its own stack declares, `stacks` the teams
    declared in their own team stacks."""

    platform: PlatformConfig
    stacks: tuple[TeamStack, ...]
    source: str  # the platform stack file

    @property
    def teams(self) -> list[TeamConfig]:
        return [*self.platform.teams, *(s.team for s in self.stacks)]

    def declared_in(self, team: str) -> str:
        """Where a team is declared: its team stack file, or the platform stack file."""
        return next((str(s.path) for s in self.stacks if s.team.name == team), self.source)

    def problems(self) -> list[str]:
        labelled = [*((f"{self.source}: teams[{i}]", t) for i, t in enumerate(self.platform.teams)),
                    *((f"{s.path}: {TEAM_CONFIG_KEY}", s.team) for s in self.stacks)]
        return team_problems(self.platform, labelled)

    def checked(self) -> Cohort:
        problems = self.problems()
        if problems:  # the platform's own teams were checked with its file: a team stack file is part of each problem
            raise CohortError(self.source, problems)
        return self

    def as_platform(self) -> PlatformConfig:
        """The platform as its users see it: every team of the cohort in `teams` (what the submitter, `check` and `plan`
        read). Not what the platform program builds: it builds only the teams its own stack declares."""
        return self.platform.model_copy(update={"teams": self.teams})


def cohort(platform: PlatformConfig, stacks_dir: str | Path, source: str) -> Cohort:
    """The platform `platform` (read from `source`) with the team stacks found next to it, checked as one cohort."""
    stacks = tuple(read_team_stack_file(p) for p in team_stack_files(stacks_dir, platform.environment))
    return Cohort(platform, stacks, source).checked()


def platform_stack_file(path: str | Path) -> StackFile:
    """The platform stack file a stack file belongs to: itself, or for a team stack file the platform's next to it."""
    path = Path(path)
    if is_team_stack_file(path):
        team_stack = read_team_stack_file(path)
        if not team_stack.platform_path.exists():
            raise ConfigError(str(path), [f"its platform stack file {team_stack.platform_path} does not exist. Fix: team stacks live "
                                          "next to the platform stack they build on (same directory, Pulumi.<env>.yaml)"])
        return read_stack_file(team_stack.platform_path)
    return read_stack_file(path)


def load_cohort(path: str | Path) -> Cohort:
    """The cohort of a stack file: a platform stack file's, or a team stack file's platform's."""
    stack = platform_stack_file(path)
    platform = from_config_map(stack.config, environment=stack.environment, source=str(stack.path))
    return cohort(platform, stack.path.parent, str(stack.path))


def load_stack_file(path: str | Path) -> PlatformConfig:
    """A stack file (a platform's or a team's) as the platform's users see it: the platform's settings with every team of
    its cohort in `teams`, checked together. Errors name the file, the field and the fix."""
    return load_cohort(path).as_platform()
