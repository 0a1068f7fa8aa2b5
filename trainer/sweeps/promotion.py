"""Promotion: a sweep trial trained on as a full job from its newest checkpoint (`trainforge sweep best --promote`)."""

from __future__ import annotations

from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, TrialKey, fact_key

def rewarm_for(hyperparameters: dict, trial_steps: int, steps: int) -> dict:
    """The promoted job's climb back (runtime RewarmConfig): from the trial's last step and the factor its schedule
    ended at, over its own warmup (at most a tenth of the steps it adds)."""
    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.runtime.schedule import cosine_factor
    defaults = RunConfig.model_fields
    warmup = int(hyperparameters.get("warmup_steps", defaults["warmup_steps"].default))
    ratio = float(hyperparameters.get("min_lr_ratio", defaults["min_lr_ratio"].default))
    ended = cosine_factor(trial_steps, warmup, trial_steps, ratio)
    return {"from_step": trial_steps, "from_factor": round(ended, 6), "steps": max(1, min(warmup or 1, (steps - trial_steps) // 10))}


def promoted(spec, sweep, trial, steps: int, study, name: str):
    """The trial's job spec trained on to `steps` from the trial's newest checkpoint (weights, optimizer, step), its
    time and cost limits scaled with its steps, its MLflow run tagged with where it comes from and nested under the
    sweep's run."""
    import math

    from trainforge.errors import TrainforgeError
    from trainforge.trainer.sweeps.study import transferred
    origin = transferred(trial)
    if origin is not None:
        earlier = origin.split("#")[0]
        raise TrainforgeError("", [f"--promote: the best trial ({trial.number}) was told to this sweep from {origin} by its warm start: it "
                                   f"never ran here, so its weights are that sweep's. Fix: `trainforge sweep best {earlier} --promote`"])
    trial_steps = sweep.max_steps(trial.params)
    if steps <= trial_steps:
        raise TrainforgeError("", [f"--steps: {steps} is not beyond the trial's own {trial_steps} steps; the promoted job continues "
                                   f"from its checkpoint. Fix: --steps above {trial_steps}"])
    scale = steps / trial_steps
    minutes = math.ceil(spec.limits.max_runtime_hours * 60 * scale)
    limits = spec.limits.model_copy(update={"max_runtime": f"{minutes // 60}h{minutes % 60}m" if minutes >= 60 else f"{minutes}m",
                                            "max_cost_usd": None if spec.limits.max_cost_usd is None else round(spec.limits.max_cost_usd * scale, 2)})
    rewarm = rewarm_for(spec.hyperparameters, trial_steps, steps)
    lineage = {"sweep": name, "trial": str(trial.number), "trial_job": str(trial.user_attrs.get(TrialKey.JOB)),
               "trial_run_id": study.user_attrs.get(fact_key(trial.number, TrialFact.MLFLOW_RUN_ID)),
               "parent_run_id": study.user_attrs.get(StudyKey.MLFLOW_RUN_ID)}
    return spec.model_copy(update={
        "hyperparameters": {**spec.hyperparameters, "max_steps": steps, "rewarm": rewarm}, "limits": limits,
        "checkpoint": spec.checkpoint.model_copy(update={"start_from": trial.user_attrs.get(TrialKey.JOB)}),
        "tracking": spec.tracking.model_copy(update={"lineage": {k: v for k, v in lineage.items() if v}})})
