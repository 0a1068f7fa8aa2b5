"""What every part of the stack config shares: a strict model base and the name patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

DNS_LABEL = r"^[a-z]([a-z0-9-]*[a-z0-9])?$"
IAM_PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"
TAG_VALUE = r"^[\w .:/=+@-]+$"


class StrictModel(BaseModel):
    # Unknown keys are typos until proven otherwise; frozen because a validated config must stay valid.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf or nan is never a setting
