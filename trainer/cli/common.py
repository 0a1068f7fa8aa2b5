"""What every command group shares: output formats, the backend choice, and reading a spec or a stack."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

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


# The options several commands take, defined once: the same flag, default and help wherever it appears.
def output_option(default: Output = Output.table):
    return typer.Option(default, "--output", "-o", help="table, json or yaml")


BACKEND_OPTION = typer.Option(BackendName.local, "--backend", help="local (this machine) or kubernetes (the kubeconfig's cluster)")
KIND_OPTION = typer.Option(Kind.trainjob, "--kind", help="kubernetes: TrainJob (Kubeflow Trainer v2) or PyTorchJob (training-operator v1)")
CONTEXT_OPTION = typer.Option(None, "--context", help="kubernetes: kubeconfig context (default: the current one)")
TEAM_OPTION = typer.Option(None, "--team", help="kubernetes: the job's team (its namespace)")
STACK_NAME_OPTION = typer.Option(..., "--stack", help="a stack name (prod -> stacks/Pulumi.prod.yaml) or a stack file")


def load_spec(path: Path) -> JobSpec:
    from trainforge.trainer.spec import load_spec as load
    return load(path)


def load_platform(stack: Path) -> PlatformConfig:
    from trainforge.stackconfig import load_stack_file
    return load_stack_file(stack)


def backend(name: BackendName, *, team: Optional[str] = None, kind: Kind = Kind.trainjob, context: Optional[str] = None,
            cost_centre: Optional[str] = None):
    from trainforge.trainer.backends import backend_for
    return backend_for(name.value, team=team, kind=kind.value, context=context, cost_centre=cost_centre)


def valid_spend(value: Optional[float]) -> Optional[float]:
    """A spend is a finite amount of USD, zero or more: nan or -1e9 would make every budget look unspent."""
    import math
    if value is not None and (not math.isfinite(value) or value < 0):
        raise typer.BadParameter(f"{value} is not an amount spent. Fix: USD this month, 0 or more (e.g. --spent 1250.50), "
                                 "or leave it out to use the recorded figure")
    return value
