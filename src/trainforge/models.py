"""What every validated model shares — the job spec, the sweep spec, the runtime's run config, the stack config: a
strict base (unknown keys are typos, a validated value stays valid, inf/nan is never a setting) and the name patterns.
Imports only pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

DNS_LABEL = r"^[a-z]([a-z0-9-]*[a-z0-9])?$"  # a Kubernetes object name people choose: jobs, teams, sweeps
RUN_ID = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"  # the runtime's job and team ids (may start with a digit)
S3_URI = r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(?P<prefix>.*))?$"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
