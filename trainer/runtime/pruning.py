"""A sweep trial's side of the study, on rank 0: report every evaluation, stop when the pruner says so, and tell
the study how the trial ended.

The decision to prune rides the step agreement like every stop rule (hooks.py), so every rank stops at the same
step; the trial exits 0 with its checkpoint kept and its state PRUNED. A heartbeat thread keeps the trial's
heartbeat fresh in the study's storage, so the controller can tell a trial whose worker died (stale heartbeat,
failed and retried once) from one that is merely slow. A preempted trial tells nothing: it resumes and goes on
reporting (a step reported twice is ignored by Optuna).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, Literal

from pydantic import Field

from trainforge import contract
from trainforge.models import StrictModel
from trainforge.trainer.runtime.config import SweepTrialConfig

log = logging.getLogger("trainforge.runtime")
# A sweep with a second objective (its trials' cost or run time, known only when they end): the worker records its
# metric here and the controller tells the study both values (trainer/sweeps/controller.py).
OBJECTIVE_VALUE_ATTR = "objective_value"


# How long a trial waits out its study database (a failover, a restart) to open the study or tell it the outcome,
# before it exits EXIT_SERVICES_DOWN for its job to restart it: telling the outcome is what the trial ran for.
TRIAL_PATIENCE_S = 300.0


class TrialReporter:
    name = "pruned"

    def __init__(self, cfg: SweepTrialConfig, patience_s: float = TRIAL_PATIENCE_S):
        import warnings

        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats: meant for optimize()
        self.cfg, self.patience_s = cfg, patience_s
        url = storage_url(cfg.storage)
        self.storage, self.study, self.trial = self._patiently("open the study", lambda: self._open(url))
        self.multi_objective = len(self.study.directions) > 1  # no pruning there; the controller tells the outcome
        self.last_value: float | None = None
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._beating, name="trainforge-trial-heartbeat", daemon=True)
        self._thread.start()

    def _open(self, url: str):
        import optuna
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=max(1, int(self.cfg.heartbeat_s)), engine_kwargs=engine_kwargs(url))
        # The study's pruner, as the controller configured it (recorded in the study: one configuration for both sides).
        study_id = storage.get_study_id_from_name(self.cfg.study)
        pruner = make_pruner(storage.get_study_user_attrs(study_id).get("pruner", {"type": "none"}))
        study = optuna.load_study(study_name=self.cfg.study, storage=storage, pruner=pruner)
        return storage, study, optuna.trial.Trial(study, self.cfg.trial_id)

    def _patiently(self, what: str, call: Callable[[], Any]) -> Any:
        """`call`, again with backoff while the study's database is out (the controller's rules: sweeps/outages.py);
        ServicesDown (EXIT_SERVICES_DOWN: the job restarts the trial) past the patience. Anything else raises at once."""
        import time

        from trainforge.trainer.sweeps.outages import Outage, database_outage
        outage = Outage(self.patience_s)
        while True:
            try:
                result = call()
            except Exception as exc:
                if not database_outage(exc):
                    raise
                log.warning("sweep trial %d: could not %s", self.cfg.trial_id, what)
                time.sleep(outage.failed(exc, poll_s=1.0))
                continue
            outage.over()
            return result

    def _beat(self) -> None:
        try:
            self.storage.record_heartbeat(self.cfg.trial_id)
        except Exception as exc:  # noqa: BLE001 - a missed beat is not worth a failed trial; the next one may land
            log.warning("trial heartbeat not recorded: %s", exc)

    def _beating(self) -> None:
        while not self._stop.wait(self.cfg.heartbeat_s):
            self._beat()

    def on_eval(self, step: int, metrics: dict[str, float]) -> str | None:
        value = float(metrics[self.cfg.metric])
        if not math.isfinite(value):
            return "pruned"  # a diverged trial: nothing to learn from continuing it
        self.last_value = value
        if self.multi_objective:
            return None
        try:
            self.trial.report(value, step)
            return "pruned" if self.trial.should_prune() else None
        except Exception as exc:
            from trainforge.trainer.sweeps.outages import database_outage
            if not database_outage(exc):
                raise
            # Every rank waits at this step's stop agreement: training goes on, unpruned this once, rather than wait.
            log.warning("sweep trial %d: the study's database is out at step %d (%s): not pruned this time, training goes on",
                        self.cfg.trial_id, step, type(exc).__name__)
            return None

    def finish(self, exit_code: int, stop_reason: str | None, final_eval: dict[str, Any] | None) -> str | None:
        """Tell the study the trial's outcome; None while the job goes on elsewhere (preempted: it resumes)."""
        self._stop.set()
        if exit_code != 0:
            return None
        outcome, tell = self._outcome(stop_reason, final_eval)
        self._patiently("tell the study", tell)
        return outcome

    def _outcome(self, stop_reason: str | None, final_eval: dict[str, Any] | None) -> tuple[str, Callable[[], Any]]:
        """What the trial came to, and how the study is told it (skip_if_finished: a tell whose commit went through
        while its answer was lost is not told twice)."""
        import optuna
        state = optuna.trial.TrialState
        if stop_reason == "pruned":
            return "pruned", lambda: self.study.tell(self.trial, state=state.PRUNED, skip_if_finished=True)
        value = (final_eval or {}).get(self.cfg.metric, self.last_value)
        if value is None or not math.isfinite(float(value)):
            return "failed", lambda: self.study.tell(self.trial, state=state.FAIL, skip_if_finished=True)
        if self.multi_objective:
            return "complete", lambda: self.trial.set_user_attr(OBJECTIVE_VALUE_ATTR, float(value))
        return "complete", lambda: self.study.tell(self.trial, float(value), skip_if_finished=True)


def storage_url(storage: str) -> str:
    """`file:PATH` reads the URL from a file (on the cluster: the team's Secret, mounted), `env:NAME` from the
    environment, so it is never in a job spec."""
    import os
    from pathlib import Path

    from trainforge.trainer.runtime.config import UserError
    if storage.startswith("file:"):
        path = Path(storage.removeprefix("file:"))
        try:
            url = path.read_text().strip()
        except OSError as exc:
            raise UserError(f"sweep.storage: cannot read {path} ({exc.strerror}). Fix: the trial's pod mounts it from the team's "
                            f"{contract.SWEEP_STORAGE_SECRET} Secret; is the team onboarded with sweeps (a `pulumi up` since)?") from None
        if not url:
            raise UserError(f"sweep.storage: {path} is empty. Fix: the team's {contract.SWEEP_STORAGE_SECRET} Secret needs its URL")
        return url
    if not storage.startswith("env:"):
        return storage
    name = storage.removeprefix("env:")
    if not os.environ.get(name):
        raise UserError(f"sweep.storage: ${name} is not set in this worker. Fix: the trial's pod takes it from the team's "
                        "trainforge-sweeps Secret; is the team onboarded with sweeps (a `pulumi up` since)?")
    return os.environ[name]


class PrunerSettings(StrictModel):
    """The study's pruner as the sweep controller resolved it from the spec (min_resource defaulting to the base's
    eval_every, max_resource to its max_steps) and recorded in the study; every trial's rank 0 validates the same record
    and builds the same pruner from it. One model for both sides, not two halves of a dict."""

    type: Literal["median", "hyperband", "successive_halving", "none"] = "none"
    startup_trials: int = Field(0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    min_resource: int | None = Field(None, ge=1)
    max_resource: int | None = Field(None, ge=1)
    reduction_factor: int = Field(3, ge=2)


def make_pruner(settings: PrunerSettings | dict[str, Any]):
    """An Optuna pruner from its settings (as recorded in the study: a dict, validated here)."""
    import optuna
    s = settings if isinstance(settings, PrunerSettings) else PrunerSettings.model_validate(settings)
    if s.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=s.startup_trials, n_warmup_steps=s.warmup_steps)
    if s.type == "hyperband":
        # Unset: Optuna's own defaults (one step; "auto", the longest trial seen).
        return optuna.pruners.HyperbandPruner(min_resource=s.min_resource or 1, max_resource=s.max_resource or "auto",
                                              reduction_factor=s.reduction_factor)
    if s.type == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=s.min_resource or "auto", reduction_factor=s.reduction_factor)
    return optuna.pruners.NopPruner()


def engine_kwargs(url: str) -> dict[str, Any]:
    # Several trials and the controller write one SQLite file: wait for the lock rather than fail at once.
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}
    # A database whose packets are dropped (not refused) would hold each connect for TCP's minutes, and every rank
    # with it at the step's stop agreement: 10 s, then the outage rules (sweeps/outages.py).
    return {"pool_pre_ping": True, **({"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else {})}
