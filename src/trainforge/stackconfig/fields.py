"""What every part of the stack config shares: a strict model base and the name patterns."""

from __future__ import annotations

from trainforge.models import DNS_LABEL, StrictModel  # noqa: F401 - the stack config's names for them
IAM_PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"
TAG_VALUE = r"^[\w .:/=+@-]+$"

