"""A team as the stack config declares it: cost centre, GPU quota per node flavour (and how much of it it may borrow
from or lend to the cohort), monthly budget, members (IAM principals), and whether the rest of the organisation may
see its jobs."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from trainforge.contract import DEFAULT_TEAM_PRIORITIES, GPU_FLAVOURS, PRIORITIES, Flavour
from trainforge.stackconfig.fields import DNS_LABEL, IAM_PRINCIPAL_ARN, TAG_VALUE, StrictModel as _Model


def _gpu_counts(quota: dict[Flavour, int], what: str) -> dict[Flavour, int]:
    without = sorted(f.value for f in quota if not f.has_gpus)
    if without:
        raise ValueError(f"{without} nodes have no GPUs (CPU work is bounded by cpu_quota). Fix: use one of {[f.value for f in GPU_FLAVOURS]}")
    negative = {f.value: n for f, n in quota.items() if n < 0}
    if negative:
        raise ValueError(f"{negative}: {what} is a GPU count, 0 or more. Fix: use 0 to give no GPUs of a flavour")
    return quota


class TeamConfig(_Model):
    name: str = Field(..., pattern=DNS_LABEL, max_length=40)
    cost_centre: str = Field(..., min_length=1, max_length=256, pattern=TAG_VALUE)
    gpu_quota: dict[Flavour, int] = Field({}, description="GPUs per node flavour the team may use at once (Kueue nominal quota)")
    borrowing_limit: dict[Flavour, int] = Field({}, description="GPUs per flavour it may borrow from the cohort beyond its quota (default: none)")
    lending_limit: dict[Flavour, int] = Field({}, description="GPUs per flavour it lends to the cohort while idle (default: all of it)")
    fair_share_weight: float = Field(1.0, gt=0, le=100, description="its share when the cohort's borrowable capacity is split")
    monthly_budget_usd: float = Field(..., gt=0)
    members: list[str] = Field([], description="IAM role or user ARNs: each gets the team's access to the cluster")
    visible_to_organisation: bool = Field(False, description="let everyone with cluster access read (not change) its jobs")
    cpu_quota: str = Field("512", pattern=r"^[0-9]+(m)?$", description="CPU requests the namespace may hold at once")
    memory_quota: str = Field("4Ti", pattern=r"^[0-9]+(Mi|Gi|Ti)$", description="memory requests the namespace may hold at once")
    ephemeral_storage_quota: str = Field("2Ti", pattern=r"^[1-9][0-9]*(Gi|Ti)$", description="node scratch disk (ephemeral-storage "
                                         "limits) the namespace's pods may hold at once")
    fsx_quota_gib: int | None = Field(None, gt=0, le=10**7, description="GiB the team's files may hold on the shared FSx (a "
                                      "Lustre group quota on its gid); default: the platform's fsx.team_quota_gib")

    priorities: list[str] = Field(list(DEFAULT_TEAM_PRIORITIES), description="job priorities its jobs may use (low, normal, high); "
                                  "high preempts the cohort's lower-priority work, so it is granted per team")

    @field_validator("priorities")
    @classmethod
    def _known_priorities(cls, priorities: list[str]) -> list[str]:
        unknown = [p for p in priorities if p not in PRIORITIES]
        if unknown or not priorities:
            raise ValueError(f"{unknown or 'empty'}: priorities are some of {list(PRIORITIES)}. Fix: e.g. [low, normal] "
                             "(add high for a team whose jobs may preempt the cohort's)")
        return list(dict.fromkeys(priorities))

    @field_validator("gpu_quota")
    @classmethod
    def _gpu_flavours(cls, quota: dict[Flavour, int]) -> dict[Flavour, int]:
        return _gpu_counts(quota, "a quota")

    @field_validator("borrowing_limit", "lending_limit")
    @classmethod
    def _limits(cls, limits: dict[Flavour, int]) -> dict[Flavour, int]:
        return _gpu_counts(limits, "a limit")

    @field_validator("members")
    @classmethod
    def _principals(cls, members: list[str]) -> list[str]:
        emails = [m for m in members if "@" in m and not m.startswith("arn:")]
        if emails:
            raise ValueError(f"{emails} are e-mail addresses; EKS grants access to IAM principals. Fix: the ARN of the role or user "
                             "each person signs in with, e.g. arn:aws:iam::<12-digit account>:role/<their SSO role>")
        bad = [m for m in members if not re.match(IAM_PRINCIPAL_ARN, m)]
        if bad:
            raise ValueError(f"{bad} are not IAM role/user ARNs. Fix: arn:aws:iam::<12-digit account>:role/<name> or :user/<name>")
        if len(set(members)) != len(members):
            raise ValueError(f"{members} lists a principal twice (EKS would refuse the second access entry). Fix: list each once")
        return members

    @model_validator(mode="after")
    def _lending_within_quota(self) -> TeamConfig:
        over = {f.value: n for f, n in self.lending_limit.items() if n > self.gpu_quota.get(f, 0)}
        if over:
            raise ValueError(f"lending_limit: {over} exceeds the team's quota {({f.value: n for f, n in self.gpu_quota.items()})}. "
                             "Fix: lend at most what it has")
        return self

    def reachable_gpus(self, flavour: Flavour) -> int:
        """The most GPUs of a flavour the team can hold at once: its quota plus what it may borrow."""
        return self.gpu_quota.get(flavour, 0) + self.borrowing_limit.get(flavour, 0)
