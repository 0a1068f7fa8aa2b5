"""Where the repository and its shipped files are: the stacks, the example specs."""

from __future__ import annotations

from pathlib import Path

from trainforge.stackconfig import load_stack_file


REPO = Path(__file__).resolve().parents[2]


STACKS = REPO / "stacks"


# Platform stacks (Pulumi.<env>.yaml); team stacks (Pulumi.<env>.team-<team>.yaml) build on one of them.
STACK_FILES = sorted(p for p in STACKS.glob("Pulumi.*.yaml") if ".team-" not in p.name)


TEAM_STACK_FILES = sorted(STACKS.glob("Pulumi.*.team-*.yaml"))


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


SPECS = [p for p in EXAMPLES if not p.name.startswith("run-")]


# The Kubernetes versions the platform's stacks run: rendered pods must be valid on each.
KUBERNETES_VERSIONS = sorted({load_stack_file(p).cluster.version for p in STACKS.glob("Pulumi.*.yaml")})
