"""The one module that touches Optuna's private attributes (as infra/engine.py is for Pulumi's): a trial's storage id
(what a trial's worker is told, unique across studies), a trial read by that id, whether a value lies in a
distribution. An Optuna upgrade that moves them breaks here, and only here."""

from __future__ import annotations

from typing import Any

import optuna


def trial_id(trial: optuna.trial.Trial | optuna.trial.FrozenTrial) -> int:
    return trial._trial_id


def stored_trial(study: optuna.Study, trial_id: int) -> optuna.trial.FrozenTrial:
    """The trial as the storage has it now (a worker may have told it since the study was read)."""
    return study._storage.get_trial(trial_id)


def fits(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except ValueError:  # a choice the categorical lacks
        return False


def grid_exhausted(study: Any) -> bool:
    """A grid study has drawn every point (GridSampler.is_exhausted; other samplers never are)."""
    sampler = study.sampler
    return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)
