"""What every command group shares: output formats, the backend choice, and reading a spec or a stack."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from trainforge.stackconfig import PlatformConfig
    from trainforge.trainer.spec import JobSpec

DEFAULT_STACK = Path("stacks/Pulumi.dev.yaml")


class Output(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class Kind(str, Enum):
    trainjob = "trainjob"
    pytorchjob = "pytorchjob"


class BackendName(str, Enum):
    local = "local"
    kubernetes = "kubernetes"


def load_spec(path: Path) -> JobSpec:
    from trainforge.trainer.spec import load_spec as load
    return load(path)


def load_platform(stack: Path) -> PlatformConfig:
    from trainforge.stackconfig import load_stack_file
    return load_stack_file(stack)


def cost_centre(spec: JobSpec, platform: Optional[PlatformConfig]) -> Optional[str]:
    team = next((t for t in platform.teams if t.name == spec.team), None) if platform is not None else None
    return team.cost_centre if team else None


def backend(name: BackendName, *, team: Optional[str] = None, kind: Kind = Kind.trainjob, context: Optional[str] = None,
            cost_centre: Optional[str] = None):
    if name is BackendName.kubernetes:
        from trainforge.trainer.backends.kubernetes import KubernetesBackend
        return KubernetesBackend(team, kind.value, context, cost_centre)
    from trainforge.trainer.backends.local import LocalBackend
    return LocalBackend()
