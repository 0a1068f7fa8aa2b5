"""A team as the stack config declares it: cost centre, GPU quota per node flavour, monthly budget, members."""

from __future__ import annotations

from pydantic import Field, field_validator

from trainforge.contract import GPU_FLAVOURS, Flavour
from trainforge.stackconfig.fields import DNS_LABEL, TAG_VALUE, StrictModel as _Model


class TeamConfig(_Model):
    name: str = Field(..., pattern=DNS_LABEL, max_length=40)
    cost_centre: str = Field(..., min_length=1, max_length=256, pattern=TAG_VALUE)
    gpu_quota: dict[Flavour, int] = Field({}, description="GPUs per node flavour the team may use at once")
    monthly_budget_usd: float = Field(..., gt=0)
    members: list[str] = []

    @field_validator("gpu_quota")
    @classmethod
    def _gpu_flavours(cls, quota: dict[Flavour, int]) -> dict[Flavour, int]:
        if Flavour.SYSTEM in quota:
            raise ValueError(f"'system' nodes have no GPUs. Fix: use one of {[f.value for f in GPU_FLAVOURS]}")
        negative = {f.value: n for f, n in quota.items() if n < 0}
        if negative:
            raise ValueError(f"{negative}: a quota is a GPU count, 0 or more. Fix: use 0 to give no GPUs of a flavour")
        return quota
