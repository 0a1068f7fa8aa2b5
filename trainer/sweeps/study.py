"""A sweep's study: created or opened again for the same search (its fingerprint), with its sampler, pruner and
directions; warm-started from earlier sweeps; read back as rows for the views. State lives here, not in any process:
the controller (controller.py) and every trial's rank 0 (runtime/pruning.py) meet in it."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from trainforge.errors import EXIT_BAD_INPUT, EXIT_FAILED, TrainforgeError
from trainforge.trainer.runtime.pruning import PrunerSettings, engine_kwargs, make_pruner
from trainforge.trainer.sweeps import optuna_access as access
from trainforge.trainer.spec import task_arg_path
from trainforge.trainer.sweeps.spec import Sweep
from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, TrialKey, fact_key

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
HEARTBEAT_S = 10.0
GRACE_S = 120  # Optuna's grace for a silent worker; the controller never fails a trial on it (only its job's end does)


class SweepError(TrainforgeError):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str):
        super().__init__("", [message])


def distributions(sweep: Sweep) -> dict[str, optuna.distributions.BaseDistribution]:
    return distributions_of(sweep.spec.space)


def distributions_of(space: dict[str, Any]) -> dict[str, optuna.distributions.BaseDistribution]:
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, p in space.items():
        if p.type == "float":
            out[name] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        elif p.type == "int":
            out[name] = optuna.distributions.IntDistribution(p.low, p.high, log=p.log, step=p.step)
        else:
            out[name] = optuna.distributions.CategoricalDistribution(p.choices)
    return out


def sampler_for(sweep: Sweep, trials_so_far: int = 0) -> optuna.samplers.BaseSampler:
    """The spec's sampler, seeded from its seed and the trials the study already has: the same history gives the same
    next parameters, and a restarted controller never replays the first start's (a sampler seeded afresh would ask
    trial 0's parameters again; TPE its start-up trials)."""
    seed = sweep.spec.seed + trials_so_far
    return {"tpe": lambda: optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup_trials(sweep.planned_trials)),
            "random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "grid": lambda: optuna.samplers.GridSampler(sweep.spec.grid(), seed=seed),
            "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)}[sweep.spec.sampler]()


def tpe_startup_trials(planned_trials: int) -> int:
    """TPE's random start-up trials before it models the space: 3 (2 for a sweep of fewer than 12 trials). Chosen by
    benchmarks/bench_search.py: on its measured char-LM space, 2 and 3 reached the target in 1.86x fewer steps than
    random search (95 % interval from 1.2x), 5 in 1.44x, Optuna's default 10 in 1.18x, 20 in 1.00x, at budgets of 20, 60
    and 120 trials alike; the rule before it (a quarter of the planned trials, 2..10) was 10 from 40 trials on."""
    return min(3, max(2, planned_trials // 4))


def directions_of(sweep: Sweep) -> list[Any]:
    """The objective's direction, and the second objective's (its cost or run time: minimised) where there is one."""
    second = sweep.spec.second_objective
    return [sweep.direction] + ([second.direction] if second else [])


def is_multi_objective(study: optuna.Study) -> bool:
    return len(study.directions) > 1


def primary_direction(study: optuna.Study) -> str:
    return study.directions[0].name.lower()


def second_objective_name(study: optuna.Study) -> str | None:
    """The second objective's metric, as the spec recorded in the study says."""
    try:
        return (json.loads(study.user_attrs[StudyKey.SPEC]).get("second_objective") or {}).get("metric")
    except (KeyError, TypeError, ValueError):
        return "second" if is_multi_objective(study) else None


def best_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The best trial, or with a second objective the Pareto front (best primary value first); [] before any completes."""
    if not any(t.state is TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return []
    if not is_multi_objective(study):
        return [study.best_trial]
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    return sorted(study.best_trials, key=lambda t: (sign * t.values[0], t.values[1]))


def knee_of(front: list[optuna.trial.FrozenTrial], directions: list[optuna.study.StudyDirection]) -> optuna.trial.FrozenTrial:
    """The Pareto front's knee: with both objectives scaled to [0, 1] (better lower), the trial farthest from the
    straight line between the front's two ends, where giving up a little of one objective buys the most of the
    other. A front of one or two trials: its first (the best primary value)."""
    if len(front) <= 2:
        return front[0]

    def scaled(i: int) -> list[float]:
        sign = -1.0 if directions[i] == optuna.study.StudyDirection.MAXIMIZE else 1.0
        values = [sign * t.values[i] for t in front]
        low, high = min(values), max(values)
        return [(v - low) / (high - low) if high > low else 0.0 for v in values]
    points = list(zip(scaled(0), scaled(1)))
    a = min(points, key=lambda p: (p[0], p[1]))  # the best primary value
    b = min(points, key=lambda p: (p[1], p[0]))  # the best second value
    length = ((b[0] - a[0]) ** 2 + (b[1] - a[1]) ** 2) ** 0.5 or 1.0
    distance = [abs((b[0] - a[0]) * (a[1] - y) - (a[0] - x) * (b[1] - a[1])) / length for x, y in points]
    return front[max(range(len(front)), key=lambda i: distance[i])]


def pruner_config(sweep: Sweep) -> dict[str, Any]:
    """The spec's pruner resolved against the base job and recorded in the study, so the controller and every trial's
    rank 0 build the same pruner (runtime/pruning.PrunerSettings validates both sides)."""
    p = sweep.spec.pruner
    settings = PrunerSettings(type=p.type, startup_trials=p.startup_trials, warmup_steps=median_warmup_steps(sweep),
                              min_resource=(p.min_resource or sweep.eval_every()) if p.type in ("hyperband", "successive_halving") else None,
                              max_resource=sweep.max_steps() if p.type == "hyperband" else None, reduction_factor=p.reduction_factor)
    return settings.model_dump(mode="json")


MEDIAN_WARMUP_FRACTION = 0.75


def median_warmup_steps(sweep: Sweep) -> int:
    """The median pruner's warm-up: the spec's, or 3/4 of the base's max_steps. benchmarks/bench_search.py: with no
    warm-up it stopped the configurations that end best (slow starters: a high learning rate behind a warm-up), and
    about half its searches never reached the target; from 3/4 on it cost nothing (1.91x fewer steps than random search,
    against 1.86x for TPE with no pruner)."""
    p = sweep.spec.pruner
    if p.type != "median":
        return p.warmup_steps or 0
    return p.warmup_steps if p.warmup_steps is not None else int(sweep.max_steps() * MEDIAN_WARMUP_FRACTION)


def quiet_optuna() -> None:
    """Heartbeats are an 'experimental' Optuna feature meant for Study.optimize; we drive trials ourselves on purpose."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage_for(url: str) -> optuna.storages.RDBStorage:
    """The study storage at `url`. Two processes opening a new database at once (a controller creating it, a `sweep
    status` or a test reading it) both create optuna's schema and both stamp its Alembic version; the second stamp fails
    on the version table's unique key (seen: a controller died of it). By then the schema is whole, so the loser opens
    the storage again."""
    import sqlalchemy.exc

    quiet_optuna()
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, heartbeat_interval=int(HEARTBEAT_S), grace_period=GRACE_S,
                                              engine_kwargs=engine_kwargs(url))
        except sqlalchemy.exc.IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# What makes a sweep the same search: what it searches, for what, how, and the job each trial runs (the base as
# resolved, so an edited base file is another search and the same base spelled another way is not). Its limits
# (max_trials, max_parallel, budget) may change between starts: raising them extends the sweep.
SEARCH_FIELDS = ("space", "objective", "sampler", "pruner", "seed")


def search_fingerprint(sweep: Sweep) -> str:
    spec = sweep.spec.model_dump(mode="json")
    # A second objective changes what is searched for; absent, the fingerprint is as it was before there was one.
    second = {"second_objective": spec["second_objective"]} if spec.get("second_objective") else {}
    return json.dumps({**{k: spec[k] for k in SEARCH_FIELDS}, **second, "base": sweep.base.model_dump(mode="json")}, sort_keys=True)


def _changes(recorded: str, now: str) -> list[str]:
    before, after = json.loads(recorded), json.loads(now)
    return [key for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


class SweepCancelled(TrainforgeError):
    """A cancelled sweep is not continued by accident: only on purpose (`trainforge sweep resume`)."""

    def __init__(self, name: str):
        super().__init__("", [f"sweep {name!r} was cancelled by `trainforge sweep cancel`. Fix: `trainforge sweep resume {name}` continues it on purpose "
                              "(trials stopped by the cancel run again with their parameters), or give a new sweep another name"],
                         exit_code=EXIT_FAILED)


def open_study(sweep: Sweep, storage_url: str, *, resume: bool = False) -> optuna.Study:
    """Create the study, or open it again for the same search — with the limits as given now: more trials, a larger
    budget or a longer wall time extend it. Another search (space, objective, sampler, pruner, seed, or the base job
    as resolved) is another sweep. A cancelled sweep opens only with `resume`, which lifts the cancel."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_for(storage_url)
    exists = sweep.name in optuna.get_all_study_names(storage)
    seeds = WarmStart() if exists else warm_start_seeds(sweep, storage, storage_url)  # refused before anything is created
    study = optuna.create_study(study_name=sweep.name, storage=storage, sampler=sampler_for(sweep),
                                pruner=make_pruner(pruner_config(sweep)), directions=directions_of(sweep), load_if_exists=True)
    recorded = study.user_attrs.get(StudyKey.SEARCH)
    adopted = with_recorded_pruner_defaults(sweep, recorded)
    if adopted is not sweep:
        sweep = adopted
        study.pruner = make_pruner(pruner_config(sweep))
    fingerprint = search_fingerprint(sweep)
    if recorded is None and study.user_attrs.get(StudyKey.SPEC) is not None:  # a study from before searches were fingerprinted
        recorded = fingerprint if _same_search_as_recorded_spec(study.user_attrs[StudyKey.SPEC], sweep) else "{}"
    if recorded is None:
        study.set_user_attr(StudyKey.SEARCH, fingerprint)
        study.set_user_attr(StudyKey.STARTED_AT, time.time())
        study.set_user_attr(StudyKey.PRUNER, pruner_config(sweep))
        for frozen in seeds.transferred:
            study.add_trial(frozen)
        for params, origin in seeds.rerun:
            study.enqueue_trial(params, user_attrs={TrialKey.WARM_START: origin}, skip_if_exists=True)
    elif recorded != fingerprint:
        raise SweepError(f"a sweep named {sweep.name!r} already exists in {storage_url} searching otherwise (changed: "
                         f"{', '.join(_changes(recorded, fingerprint)) or 'the spec'}). Fix: give the new sweep another name "
                         "(a changed search space, objective, sampler, pruner, seed or base job is a new study); max_trials, "
                         "max_parallel and the budget may change to extend it")
    if study.user_attrs.get(StudyKey.CANCELLED):
        if not resume:
            raise SweepCancelled(sweep.name)
        study.set_user_attr(StudyKey.CANCELLED, False)
        study.set_user_attr(StudyKey.RESUMED, [*study.user_attrs.get(StudyKey.RESUMED, []), time.time()])
    study.set_user_attr(StudyKey.SEARCH, fingerprint)
    study.set_user_attr(StudyKey.SPEC, sweep.spec.model_dump_json())  # the limits as given this time
    study.set_user_attr(StudyKey.PLANNED_TRIALS, sweep.planned_trials)
    if study.trials:
        study.sampler = sampler_for(sweep, len(study.trials))
    return study


def with_recorded_pruner_defaults(sweep: Sweep, recorded: str | None) -> Sweep:
    """The sweep with each pruner field its file leaves out taken from the search its study recorded: a default that
    changed since (the median pruner's warm-up, median_warmup_steps) neither makes an existing sweep another search nor
    changes how it prunes. A field the file sets is the file's, and compared as before."""
    before = (json.loads(recorded).get("pruner") or {}) if recorded else {}
    pruner = sweep.spec.pruner
    if before.get("type", pruner.type) != pruner.type:
        return sweep  # another pruner altogether: open_study names the change
    left_out = {k: before[k] for k in type(pruner).model_fields if k in before and k not in pruner.model_fields_set}
    if not left_out or all(getattr(pruner, k) == v for k, v in left_out.items()):
        return sweep
    spec = sweep.spec.model_copy(update={"pruner": pruner.model_copy(update=left_out)})
    return Sweep(spec, sweep.base, sweep.direction, sweep.source)


WARM_START_BEST = 3  # trials taken from each earlier sweep


@dataclass
class WarmStart:
    """What a warm start brings: trials told to the new study as they ended (its sampler learns from them, nothing
    re-runs), and parameters to run again where an earlier trial's value cannot be told as this sweep's."""
    transferred: list[optuna.trial.FrozenTrial] = field(default_factory=list)
    rerun: list[tuple[dict[str, Any], str]] = field(default_factory=list)


def warm_start_seeds(sweep: Sweep, storage: optuna.storages.BaseStorage, storage_url: str) -> WarmStart:
    """The earlier sweeps the spec names, refused where they do not compare (incomparable). An earlier complete trial
    whose every searched field this sweep searches too, in range, is transferred with its value and its evaluations
    (Optuna's add_trial: no step of it runs again). A trial that searched a field this sweep does not (its value came
    from a setting this sweep fixes) or a sweep of two objectives is not told as this one's: the best complete trials
    (up to WARM_START_BEST each, best first) run again here with the fields this sweep searches (values outside its
    ranges leave the trial out)."""
    space = distributions(sweep)
    found = WarmStart()
    names = optuna.get_all_study_names(storage)
    for name in sweep.spec.warm_start:
        if name not in names:
            raise SweepError(f"warm_start: no sweep named {name!r} in {storage_url}. Fix: one of {sorted(names)}, "
                             "or drop it (a warm start reads earlier sweeps in this sweep's own storage)")
        earlier = optuna.load_study(study_name=name, storage=storage)
        problems = incomparable(name, earlier, sweep)
        if problems:
            raise SweepError("; ".join(problems))
        complete = [t for t in earlier.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE]
        maximize = earlier.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        complete.sort(key=lambda t: t.values[0], reverse=maximize)
        single = sweep.spec.second_objective is None and len(earlier.directions) == 1
        others = []
        for t in complete:
            if single and t.params and all(k in space and access.fits(space[k], v) for k, v in t.params.items()):
                found.transferred.append(optuna.trial.create_trial(
                    params=dict(t.params), distributions={k: space[k] for k in t.params}, value=t.values[0],
                    intermediate_values=dict(t.intermediate_values), user_attrs={TrialKey.TRANSFERRED_FROM: f"{name}#{t.number}"}))
            else:
                others.append(t)
        for t in others[:WARM_START_BEST]:
            params = {k: v for k, v in t.params.items() if k in space}
            if params and all(access.fits(space[k], v) for k, v in params.items()):
                found.rerun.append((params, f"{name}#{t.number}"))
    return found


def transferred(trial: optuna.trial.FrozenTrial) -> str | None:
    """The earlier sweep's trial this one was told from ("sweep#number"), or None for a trial that ran in this sweep."""
    return trial.user_attrs.get(TrialKey.TRANSFERRED_FROM)


# How often a trial is measured and logged, not what it measures: an earlier sweep that differs only here compares.
NOT_COMPARED_HYPERPARAMETERS = frozenset({"log_every", "eval_every"})


def incomparable(name: str, earlier: optuna.Study, sweep: Sweep) -> list[str]:
    """Why an earlier sweep's values cannot seed this one: another objective (metric or direction), or its trials
    trained on another base (task, task arguments, workers, or a hyperparameter this sweep does not search), where the
    same parameters would score otherwise. Empty where they compare (or the earlier study predates the record)."""
    recorded = json.loads(earlier.user_attrs.get(StudyKey.SEARCH) or "{}")
    if not recorded:
        return []
    problems = []
    metric = (recorded.get("objective") or {}).get("metric")
    direction = earlier.directions[0].name.lower()
    if (metric, direction) != (sweep.spec.objective.metric, sweep.direction):
        problems.append(f"warm_start: sweep {name!r} optimised {metric} ({direction}), this sweep {sweep.spec.objective.metric} "
                        f"({sweep.direction}): its best trials are not this sweep's. Fix: warm-start from a sweep of the same objective")
    then, now = recorded.get("base") or {}, sweep.base.model_dump(mode="json")
    searched = set(sweep.spec.space)
    differ = []

    def compare(section: str, before: dict[str, Any], after: dict[str, Any], skip: Any = lambda key: False) -> None:
        for key in sorted(set(before) | set(after)):
            if not skip(key) and before.get(key) != after.get(key):
                differ.append(f"{section}.{key} {before.get(key)} vs {after.get(key)}")
    entry_then, entry_now = then.get("entry") or {}, now.get("entry") or {}
    compare("entry", entry_then, entry_now, lambda key: key == "args")
    compare("entry.args", entry_then.get("args") or {}, entry_now.get("args") or {}, lambda key: task_arg_path(key) in searched)
    compare("workers", then.get("workers") or {}, now.get("workers") or {})
    compare("hyperparameters", then.get("hyperparameters") or {}, now.get("hyperparameters") or {},
            lambda key: key in searched or key in NOT_COMPARED_HYPERPARAMETERS)
    if differ:
        problems.append(f"warm_start: sweep {name!r} trained its trials on another base ({'; '.join(differ)}): the same parameters "
                        "would score otherwise here. Fix: warm-start from a sweep of this base, or search the field that differs")
    return problems


def _same_search_as_recorded_spec(recorded_spec: str, sweep: Sweep) -> bool:
    before = json.loads(recorded_spec)
    now = sweep.spec.model_dump(mode="json")
    return all(before.get(k) == now[k] for k in SEARCH_FIELDS)


def load_existing(name: str, storage_url: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=storage_for(storage_url))
    except KeyError:
        raise SweepError(f"no sweep named {name!r} in {storage_url}. Fix: check the name, or --storage for where it was "
                         "started") from None
    except Exception as exc:  # the storage itself: SQLAlchemy's errors (bad URL, unreachable server, unreadable file)
        if type(exc).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise SweepError(f"cannot open the study storage {storage_url}: {str(exc).splitlines()[0]}. Fix: check --storage "
                         "(and that its database answers)") from None


@dataclass
class TrialRow:
    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    cost_usd: float | None
    duration_s: float | None  # running time where its job's clock timed it (run_clock), else its trial's start to end
    job: str | None
    retry_of: int | None
    last_step: int | None
    stopped: str | None = None  # why it was stopped on purpose (cancel, wall time): not a failure of its own
    second: float | None = None  # the second objective's value (the trial's cost or run time), where the sweep has one
    queued_s: float | None = None  # from its job's creation to its first running moment, where timed
    transferred_from: str | None = None  # "sweep#number": told from an earlier sweep by a warm start, never run here


def rows(study: optuna.Study, trials: list[optuna.trial.FrozenTrial] | None = None) -> list[TrialRow]:
    """A row per trial (`trials`: the study's, where the caller has just read them)."""
    attrs = study.user_attrs
    out = []
    for t in study.get_trials(deepcopy=False) if trials is None else trials:
        duration = attrs.get(fact_key(t.number, TrialFact.RUN_S))
        if duration is None and t.datetime_complete and t.datetime_start:
            duration = (t.datetime_complete - t.datetime_start).total_seconds()
        stopped = attrs.get(fact_key(t.number, TrialFact.STOPPED))
        state = "cancelled" if stopped and t.state is TrialState.FAIL else t.state.name.lower()
        values = t.values if t.state is TrialState.COMPLETE and t.values else [None, None]
        out.append(TrialRow(number_of(t), state, values[0], dict(t.params),
                            attrs.get(fact_key(t.number, TrialFact.COST_USD)), duration, t.user_attrs.get(TrialKey.JOB), t.user_attrs.get(TrialKey.RETRY_OF),
                            max(t.intermediate_values) if t.intermediate_values else None, stopped,
                            values[1] if len(values) > 1 else None, attrs.get(fact_key(t.number, TrialFact.QUEUED_S)), transferred(t)))
    return out


def number_of(trial: optuna.trial.FrozenTrial) -> int:
    """The trial's number in its sweep. A study rebuilt from a bounded status object (sweeps/cluster.study_from) holds a
    selection of the trials, each keeping its own number."""
    return int(trial.user_attrs.get(TrialKey.TRIAL_NUMBER, trial.number))


def counted(study: optuna.Study, trials: list[optuna.trial.FrozenTrial] | None = None) -> int:
    """Trials that count towards the plan: finished ones, less failures that were retried (their retry counts) and
    trials transferred from an earlier sweep (they never ran here).
    `trials`: the study's, where the caller has just read them."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    retried = {t.user_attrs[TrialKey.RETRY_OF] for t in trials if TrialKey.RETRY_OF in t.user_attrs}
    return sum(1 for t in trials if t.state in FINISHED and not (t.state is TrialState.FAIL and t.number in retried)
               and transferred(t) is None)


