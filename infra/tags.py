"""Cost-allocation tags. Provider default tags cover resources AWS tags directly; explicit tags on every
taggable resource make the intent visible to tests and policies, and launch templates carry them to the
instances, volumes and interfaces that node groups create (node-group tags do not propagate)."""

from __future__ import annotations

from trainforge import contract
from trainforge.stackconfig import TagsConfig


def cost_tags(tags: TagsConfig, environment: str) -> dict[str, str]:
    return {
        **tags.extra,
        contract.TAG_PROJECT: contract.PROJECT,
        contract.TAG_ENVIRONMENT: environment,
        contract.TAG_COST_CENTRE: tags.cost_centre,
        contract.TAG_OWNER: tags.owner,
        contract.TAG_MANAGED_BY: contract.MANAGED_BY_VALUE,
    }


def named(tags: dict[str, str], name: str, **extra: str) -> dict[str, str]:
    """`tags` plus the console `Name` tag and any resource-specific tags."""
    return {**tags, "Name": name, **extra}
