"""Every key a sweep stores in its Optuna study beside Optuna's own fields, named once.

Three places, each for a reason:
- `StudyKey`: the study's user attrs, the sweep's own state (its spec, why it ended, its MLflow run...);
- `TrialKey`: a trial's own user attrs, written while it is created or runs (its job, the trial it retries);
- `TrialFact` under `trial.<number>.<fact>` in the study's user attrs: what the controller learns of a trial once it
  has ended (its cost, its running time, why it was stopped), which Optuna no longer lets anyone write on a finished
  trial itself.
Every sweep's database holds these names: renaming one orphans what earlier sweeps wrote.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Optional


class StudyKey:
    SPEC: Final = "spec"  # the sweep spec as given this time (JSON): its objective, limits
    SEARCH: Final = "search"  # the search's fingerprint: a continued sweep must search the same space the same way
    STARTED_AT: Final = "started_at"
    PRUNER: Final = "pruner"
    PLANNED_TRIALS: Final = "planned_trials"
    EXTENDED: Final = "extended"  # the limits as raised by `extend`, and the requests taken up (by id)
    # `extension.<id>`: one member's extension asked (extension_key), each its own key so that no write loses another's
    EXTENSIONS_TAKEN: Final = "extensions_taken"  # earlier versions' record of the requests taken up (read only)
    CANCELLED: Final = "cancelled"
    CANCEL_TAKEN: Final = "cancel_taken"  # the cluster cancel request already taken up (a resumed sweep is not cancelled again)
    RESUMED: Final = "resumed"  # when a cancelled sweep was resumed on purpose
    FINISHED_BECAUSE: Final = "finished_because"
    MLFLOW_RUN_ID: Final = "mlflow_run_id"  # the sweep's parent run
    RAN_S: Final = "ran_s"  # the controllers' running time, summed over restarts (the wall-time budget's clock)
    CONTROLLER_SEEN_AT: Final = "controller_seen_at"  # a controller's last look: `extend` tells whether one takes it up
    STATUS_HOLDS: Final = "status_holds"  # a study rebuilt from a bounded status object: which trials it holds


class TrialKey:
    JOB: Final = "job"  # the trial's training job
    LAUNCH: Final = "launch"  # "intended" before its job is submitted, "submitted" after (a restart tells them apart)
    ESTIMATE_USD: Final = "estimate_usd"  # its cost estimated at launch (what the budget holds back while it runs)
    RETRY_OF: Final = "retry_of"  # the trial whose parameters it runs again
    NEVER_STARTED: Final = "never_started"  # a retry of a trial whose job was never submitted
    WARM_START: Final = "warm_start"  # enqueued from an earlier sweep's trial ("sweep#number")
    TRANSFERRED_FROM: Final = "transferred_from"  # told from an earlier sweep's trial ("sweep#number"): never ran here
    TRIAL_NUMBER: Final = "trial_number"  # its number in its sweep, in a study rebuilt from a bounded status object


class TrialFact(str, Enum):
    SETTLED = "settled"  # its end was accounted for (cost, MLflow), once
    STOPPED = "stopped"  # why it was stopped on purpose (cancel, wall time): not a failure of its own, not retried
    COST_USD = "cost_usd"
    RUN_S = "run_s"  # its job's running time
    MLFLOW_RUN_ID = "mlflow_run_id"
    RUNNING_SINCE = "running_since"  # the run clock: when its job was last seen start running (run_clock.py)
    RAN_S = "ran_s"  # the run clock: running time summed over earlier runs
    QUEUED_S = "queued_s"  # from its job's creation to its first running moment


FACT_PREFIX = "trial."
EXTENSION_PREFIX = "extension."


def extension_key(request: str) -> str:
    return f"{EXTENSION_PREFIX}{request}"


def extension_of(key: str) -> Optional[str]:
    """The request id of a key extension_key wrote; None for any other key."""
    return key[len(EXTENSION_PREFIX):] if key.startswith(EXTENSION_PREFIX) and len(key) > len(EXTENSION_PREFIX) else None


def fact_key(number: int, fact: TrialFact) -> str:
    return f"{FACT_PREFIX}{number}.{fact.value}"


def fact_of(key: str) -> Optional[tuple[int, TrialFact]]:
    """(trial number, fact) for a study key `fact_key` wrote; None for any other key."""
    prefix, _, rest = key.partition(".")
    number, _, fact = rest.partition(".")
    if prefix + "." != FACT_PREFIX or not number.isdigit():
        return None
    try:
        return int(number), TrialFact(fact)
    except ValueError:
        return None
