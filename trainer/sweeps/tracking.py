"""A sweep in MLflow: its parent run (sampler, pruner, space, objective; the best trial, what was spent) and, on each
trial's own run (created by the trial's rank 0, nested under the parent), its number, state, cost and value."""

from __future__ import annotations

import json

import optuna

from trainforge import run_tags
from trainforge.trainer.runtime.config import UserError
from trainforge.trainer.runtime.tracking import ForeignExperiment, owned_experiment
from trainforge.trainer.sweeps.spec import Sweep
from trainforge.trainer.sweeps.study import best_trials
from trainforge.trainer.sweeps.keys import StudyKey, TrialKey


class SweepTracking:
    """The sweep's parent run in MLflow; each trial's own run (created by its rank 0) is nested under it."""

    def __init__(self, uri: str, sweep: Sweep, study: optuna.Study):
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient(uri)
        self.team = sweep.base.team
        parent_run_id = study.user_attrs.get(StudyKey.MLFLOW_RUN_ID)
        if parent_run_id is None:
            name = run_tags.team_experiment(sweep.base.team, sweep.base.tracking.experiment)  # where its trials' runs are
            try:  # the trials' own runs check the same before logging
                experiment_id = owned_experiment(self.client, uri, name, sweep.base.team)
            except ForeignExperiment as e:
                raise UserError(str(e)) from None
            run = self.client.create_run(experiment_id, run_name=sweep.name,
                                         tags={run_tags.SWEEP: sweep.name, run_tags.TEAM: sweep.base.team})
            parent_run_id = run.info.run_id
            study.set_user_attr(StudyKey.MLFLOW_RUN_ID, parent_run_id)
            spec = sweep.spec
            params = {"sampler": spec.sampler, "pruner": spec.pruner.type, "max_trials": spec.max_trials, "max_parallel": spec.max_parallel,
                      "objective": f"{spec.objective.metric} ({sweep.direction})", "seed": spec.seed,
                      "space": json.dumps({k: v.model_dump() for k, v in spec.space.items()})[:6000]}
            for key, value in params.items():
                self.client.log_param(parent_run_id, key, value)
        self.parent_run_id: str = parent_run_id

    def trial_finished(self, trial: optuna.trial.FrozenTrial, job: str | None, cost: float) -> str | None:
        """Log the trial on the parent run and tag its own run; the trial's run id, where it has one."""
        self.client.log_metric(self.parent_run_id, "trial_cost_usd", cost, step=trial.number)
        value = trial.values[0] if trial.values else None
        if value is not None:
            self.client.log_metric(self.parent_run_id, "trial_value", value, step=trial.number)
        found = self.client.search_runs([self.client.get_run(self.parent_run_id).info.experiment_id],
                                        filter_string=f"tags.`{run_tags.JOB}` = '{job}' and "
                                                      f"tags.`{run_tags.TEAM}` = '{self.team}'", max_results=1) if job else []
        for run in found:
            for key, tag in {run_tags.TRIAL: trial.number, run_tags.TRIAL_STATE: trial.state.name.lower(),
                             run_tags.TRIAL_COST_USD: f"{cost:.6f}", run_tags.TRIAL_VALUE: value}.items():
                self.client.set_tag(run.info.run_id, key, str(tag))
        return found[0].info.run_id if found else None

    def sweep_finished(self, study: optuna.Study, spent: float, why: str) -> None:
        self.client.set_tag(self.parent_run_id, run_tags.SWEEP_FINISHED_BECAUSE, why)
        self.client.log_metric(self.parent_run_id, "spent_usd", spent)
        front = best_trials(study)
        if front:
            best = front[0]
            self.client.log_metric(self.parent_run_id, "best_value", best.values[0])
            self.client.set_tag(self.parent_run_id, run_tags.SWEEP_BEST_TRIAL, str(best.number))
            self.client.set_tag(self.parent_run_id, run_tags.SWEEP_BEST_JOB, str(best.user_attrs.get(TrialKey.JOB)))
        self.client.set_terminated(self.parent_run_id, "FINISHED")
