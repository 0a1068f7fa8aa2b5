"""The sweep controller: an Optuna study whose trials are real training jobs on a Backend.

State lives in the study's storage, never in this process: every trial's job name, its estimate and its cost are
recorded there as they happen, so a controller killed at any point and started again with the same command
continues the same study — finished trials kept; running trials reconciled with their jobs (a job still running is
adopted, a job that is gone or failed makes its trial FAIL and, once, retried with the same parameters); no trial
launched twice; the planned number of trials in the end.

A trial is pruned from inside the runtime (runtime/pruning.py): rank 0 reports each evaluation and asks the
study's pruner. The controller only launches, watches, prices and reconciles.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from trainforge import contract
from trainforge.errors import EXIT_BAD_INPUT, TrainforgeError
from trainforge.trainer.admission import Admission, NotAdmitted
from trainforge.trainer.backends import JobPhase, NoSuchJob
from trainforge.trainer.runtime.pruning import OBJECTIVE_VALUE_ATTR, engine_kwargs, make_pruner
from trainforge.trainer.spec import JobSpec
from trainforge.trainer.sweeps import optuna_access as access
from trainforge.trainer.sweeps.spec import Sweep, trial_job

log = logging.getLogger("trainforge.sweeps")
TERMINAL = frozenset(s for s in JobPhase if s.ended)  # whoever reports it: local (lost: its supervisor gone) or cluster
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
HEARTBEAT_S = 10.0
GRACE_S = 120  # a trial whose worker has not beaten for this long is failed (and retried once)


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
    return {"tpe": lambda: optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, sweep.planned_trials // 4))),
            "random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "grid": lambda: optuna.samplers.GridSampler(sweep.spec.grid(), seed=seed),
            "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)}[sweep.spec.sampler]()


def directions_of(sweep: Sweep) -> list[str]:
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
        return (json.loads(study.user_attrs["spec"]).get("second_objective") or {}).get("metric")
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


def pruner_config(sweep: Sweep) -> dict[str, Any]:
    """Recorded in the study, so the controller and every trial's rank 0 build the same pruner (runtime/pruning.py)."""
    p = sweep.spec.pruner
    if p.type == "median":
        return {"type": "median", "startup_trials": p.startup_trials, "warmup_steps": p.warmup_steps}
    if p.type == "hyperband":
        return {"type": "hyperband", "min_resource": p.min_resource or sweep.eval_every(), "max_resource": sweep.max_steps(),
                "reduction_factor": p.reduction_factor}
    if p.type == "successive_halving":
        return {"type": "successive_halving", "min_resource": p.min_resource or sweep.eval_every(), "reduction_factor": p.reduction_factor}
    return {"type": "none"}


def quiet_optuna() -> None:
    """Heartbeats are an 'experimental' Optuna feature meant for Study.optimize; we drive trials ourselves on purpose."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage_for(url: str) -> optuna.storages.RDBStorage:
    quiet_optuna()
    return optuna.storages.RDBStorage(url, heartbeat_interval=int(HEARTBEAT_S), grace_period=GRACE_S, engine_kwargs=engine_kwargs(url))


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
                         exit_code=1)


def open_study(sweep: Sweep, storage_url: str, *, resume: bool = False) -> optuna.Study:
    """Create the study, or open it again for the same search — with the limits as given now: more trials, a larger
    budget or a longer wall time extend it. Another search (space, objective, sampler, pruner, seed, or the base job
    as resolved) is another sweep. A cancelled sweep opens only with `resume`, which lifts the cancel."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_for(storage_url)
    exists = sweep.name in optuna.get_all_study_names(storage)
    seeds = [] if exists else warm_start_seeds(sweep, storage, storage_url)  # refused before anything is created
    study = optuna.create_study(study_name=sweep.name, storage=storage, sampler=sampler_for(sweep),
                                pruner=make_pruner(pruner_config(sweep)), directions=directions_of(sweep), load_if_exists=True)
    fingerprint = search_fingerprint(sweep)
    recorded = study.user_attrs.get("search")
    if recorded is None and study.user_attrs.get("spec") is not None:  # a study from before searches were fingerprinted
        recorded = fingerprint if _same_search_as_recorded_spec(study.user_attrs["spec"], sweep) else "{}"
    if recorded is None:
        study.set_user_attr("search", fingerprint)
        study.set_user_attr("started_at", time.time())
        study.set_user_attr("pruner", pruner_config(sweep))
        for params, origin in seeds:
            study.enqueue_trial(params, user_attrs={"warm_start": origin}, skip_if_exists=True)
    elif recorded != fingerprint:
        raise SweepError(f"a sweep named {sweep.name!r} already exists in {storage_url} searching otherwise (changed: "
                         f"{', '.join(_changes(recorded, fingerprint)) or 'the spec'}). Fix: give the new sweep another name "
                         "(a changed search space, objective, sampler, pruner, seed or base job is a new study); max_trials, "
                         "max_parallel and the budget may change to extend it")
    if study.user_attrs.get("cancelled"):
        if not resume:
            raise SweepCancelled(sweep.name)
        study.set_user_attr("cancelled", False)
        study.set_user_attr("resumed", [*study.user_attrs.get("resumed", []), time.time()])
    study.set_user_attr("search", fingerprint)
    study.set_user_attr("spec", sweep.spec.model_dump_json())  # the limits as given this time
    study.set_user_attr("planned_trials", sweep.planned_trials)
    if study.trials:
        study.sampler = sampler_for(sweep, len(study.trials))
    return study


WARM_START_BEST = 3  # trials taken from each earlier sweep


def warm_start_seeds(sweep: Sweep, storage: optuna.storages.BaseStorage, storage_url: str) -> list[tuple[dict[str, Any], str]]:
    """The best complete trials of the earlier sweeps the spec names (up to WARM_START_BEST each, best first), as
    parameters this sweep can run: fields it does not search are dropped (its sampler fills the rest), values outside
    its ranges leave the trial out."""
    space = distributions(sweep)
    seeds: list[tuple[dict[str, Any], str]] = []
    names = optuna.get_all_study_names(storage)
    for name in sweep.spec.warm_start:
        if name not in names:
            raise SweepError(f"warm_start: no sweep named {name!r} in {storage_url}. Fix: one of {sorted(names)}, "
                             "or drop it (a warm start reads earlier sweeps in this sweep's own storage)")
        earlier = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in earlier.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE]
        maximize = earlier.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        complete.sort(key=lambda t: t.values[0], reverse=maximize)
        for t in complete[:WARM_START_BEST]:
            params = {k: v for k, v in t.params.items() if k in space}
            if params and all(access.fits(space[k], v) for k, v in params.items()):
                seeds.append((params, f"{name}#{t.number}"))
    return seeds




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


# ---- extension: limits raised after the start ---------------------------------------------------------------------
# `trainforge sweep extend` records the raised limits in the study; they are floors over the spec's own (a spec asking
# for more raises them further), read by a running controller at its next look and by every later start.
EXTENDED = "extended"


@dataclass(frozen=True)
class Limits:
    max_trials: int
    usd: float | None
    wall_time_s: float | None

    @classmethod
    def of(cls, sweep: Sweep) -> Limits:
        return cls(sweep.spec.max_trials, sweep.spec.budget.usd, sweep.spec.budget.wall_time_s)

    def raised_by(self, floor: dict[str, Any]) -> Limits:
        def higher(mine: float | None, theirs: float | None) -> float | None:
            if mine is None or theirs is None:
                return mine  # unlimited stays unlimited; no extension leaves the spec's
            return max(mine, theirs)
        return Limits(max(self.max_trials, int(floor.get("max_trials") or 0)), higher(self.usd, floor.get("usd")),
                      higher(self.wall_time_s, floor.get("wall_time_s")))


def in_effect(sweep: Sweep, study: optuna.Study) -> Sweep:
    """The sweep under the limits in effect: the spec's, raised by any extension recorded in the study."""
    limits = Limits.of(sweep).raised_by(study.user_attrs.get(EXTENDED) or {})
    if limits == Limits.of(sweep):
        return sweep
    return sweep.with_limits(max_trials=limits.max_trials, usd=limits.usd, wall_time_s=limits.wall_time_s)


def recorded_limits(study: optuna.Study) -> Limits:
    """The limits of the latest start (its spec), raised by extensions: what `extend` adds to."""
    spec = json.loads(study.user_attrs.get("spec") or "{}")
    budget = spec.get("budget") or {}
    wall = budget.get("wall_time")
    from trainforge.trainer.sweeps.spec import parse_duration
    base = Limits(int(spec.get("max_trials", 0)), budget.get("usd"), None if wall is None else parse_duration(wall, "budget.wall_time"))
    return base.raised_by(study.user_attrs.get(EXTENDED) or {})


def extend(study: optuna.Study, *, trials: int = 0, usd: float = 0.0, wall_time_s: float = 0.0) -> tuple[Limits, Limits]:
    """Raise the sweep's limits by these amounts (a limit the sweep never had stays unlimited); (before, after)."""
    before = recorded_limits(study)
    after = Limits(before.max_trials + trials, None if before.usd is None else before.usd + usd,
                   None if before.wall_time_s is None else before.wall_time_s + wall_time_s)
    study.set_user_attr(EXTENDED, {"max_trials": after.max_trials, "usd": after.usd, "wall_time_s": after.wall_time_s,
                                   "at": time.time()})
    return before, after


CONTROLLER_SEEN_S = 30.0  # a controller that wrote its running time this recently is taken to be running


def controller_running(study: optuna.Study) -> bool:
    seen = study.user_attrs.get("controller_seen_at")
    return seen is not None and time.time() - float(seen) < CONTROLLER_SEEN_S and not study.user_attrs.get("finished_because")


@dataclass
class TrialRow:
    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    cost_usd: float | None
    duration_s: float | None
    job: str | None
    retry_of: int | None
    last_step: int | None
    stopped: str | None = None  # why it was stopped on purpose (cancel, wall time): not a failure of its own
    second: float | None = None  # the second objective's value (the trial's cost or run time), where the sweep has one


def rows(study: optuna.Study) -> list[TrialRow]:
    attrs = study.user_attrs
    out = []
    for t in study.get_trials(deepcopy=False):
        duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        stopped = attrs.get(f"trial.{t.number}.stopped")
        state = "cancelled" if stopped and t.state is TrialState.FAIL else t.state.name.lower()
        values = t.values if t.state is TrialState.COMPLETE and t.values else [None, None]
        out.append(TrialRow(t.number, state, values[0], dict(t.params),
                            attrs.get(f"trial.{t.number}.cost_usd"), duration, t.user_attrs.get("job"), t.user_attrs.get("retry_of"),
                            max(t.intermediate_values) if t.intermediate_values else None, stopped,
                            values[1] if len(values) > 1 else None))
    return out


CANCELLED = "cancelled"  # the controller's answer when `trainforge sweep cancel` stopped it


def counted(study: optuna.Study) -> int:
    """Trials that count towards the plan: finished ones, less failures that were retried (their retry counts)."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    return sum(1 for t in trials if t.state in FINISHED and not (t.state is TrialState.FAIL and t.number in retried))


def trial_estimate(spec: JobSpec, decision: Admission) -> float:
    """What a trial may cost at most: the admission's estimate (its max_runtime on its instance type); without a
    stack, the same at the price table's first region — where the local ledger prices local jobs too."""
    if decision.cost is not None:
        return decision.cost.expected_usd
    where = decision.placement
    if where.instance is None:
        return 0.0
    from trainforge.pricing import PriceUnknown, estimate, price_table
    try:
        return estimate(where.instance.name, where.nodes, spec.limits.max_runtime_hours, spec.capacity,
                        where.region or price_table().regions[0]).expected_usd
    except PriceUnknown:
        return 0.0


# Fault injection, for tests that prove the launch path: `TRAINFORGE_SWEEP_KILL_AT=<step>:<n>` makes this controller
# SIGKILL itself the n-th time it reaches <step> — a real kill of a real process, at a moment a test could not hit by
# timing. Unset (always, outside such tests), each point is one dictionary lookup.
KILL_AT_ENV = "TRAINFORGE_SWEEP_KILL_AT"
LAUNCH_STEPS = ("asked", "intended", "admitted", "created", "recorded", "settling")
_reached: dict[str, int] = {}


def kill_point(step: str) -> None:
    wanted = os.environ.get(KILL_AT_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != step:
        return
    _reached[step] = _reached.get(step, 0) + 1
    if _reached[step] == int(nth or 1):
        log.warning("%s=%s: killing this controller (SIGKILL)", KILL_AT_ENV, wanted)
        os.kill(os.getpid(), signal.SIGKILL)


RAN_SAVE_S = 5.0  # how often the time the sweep ran is written to the study (a kill loses at most this much)


class SweepController:
    def __init__(self, sweep: Sweep, backend: Any, admit: Callable[[JobSpec], Admission], storage_url: str,
                 tracking_uri: str | None = None, poll_s: float = 1.0, on_change: Callable[[SweepController], None] | None = None,
                 trial_storage: str | None = None, resume: bool = False, on_look: Callable[[SweepController], None] | None = None):
        """`resume`: continue a cancelled sweep on purpose. `trial_storage`: how trials name the study's storage, where they see it differently (on the cluster: the
        team's Secret mounted as a file, `file:/var/run/trainforge/sweep-database/storage`); default: the same URL."""
        self.given, self.backend, self.admit, self.storage_url = sweep, backend, admit, storage_url
        self.trial_storage = trial_storage or storage_url
        self.poll_s, self.on_change, self.on_look = poll_s, on_change, on_look  # on_look: each look (the cluster's requests)
        self.study = open_study(sweep, storage_url, resume=resume)
        self.sweep = in_effect(sweep, self.study)
        self._extension = self.study.user_attrs.get(EXTENDED)
        self.running: dict[int, tuple[int, str]] = {}  # trial number -> (trial id, job name)
        self.stopped_because = ""
        self._per_trial: float | None = None
        self.tracking = _Tracking(tracking_uri, sweep, self.study) if tracking_uri else None
        # The wall time counts the time a controller ran the sweep, over every start: time with no controller up (a
        # crash, a laptop asleep) is not the sweep's. Kept in the study, saved every RAN_SAVE_S.
        self.ran_s = float(self.study.user_attrs.get("ran_s", 0.0))
        self._clock = time.monotonic()
        self._saved_ran_s = self.ran_s

    def account_time(self) -> None:
        now = time.monotonic()
        self.ran_s += now - self._clock
        self._clock = now
        if self.ran_s - self._saved_ran_s >= RAN_SAVE_S:
            self._save_ran_s()

    def _save_ran_s(self) -> None:
        self.study.set_user_attr("ran_s", self.ran_s)
        self.study.set_user_attr("controller_seen_at", time.time())  # `extend` tells whether a controller will take it up
        self._saved_ran_s = self.ran_s

    def take_extension(self, attrs: dict[str, Any]) -> None:
        """Limits raised by `trainforge sweep extend` while this controller runs: in effect from this look on; a sweep
        that had stopped launching for its budget launches again."""
        if attrs.get(EXTENDED) == self._extension:
            return
        self._extension = attrs.get(EXTENDED)
        self.sweep = in_effect(self.given, self.study)
        self.study.set_user_attr("planned_trials", self.sweep.planned_trials)
        if self.stopped_because.startswith("the USD budget"):
            self.stopped_because = ""
        log.info("extended: %d trials, budget %s, wall time %s", self.sweep.spec.max_trials, self.sweep.spec.budget.usd,
                 self.sweep.spec.budget.wall_time)
        self._changed()

    # ---- the loop ----------------------------------------------------------------------------------------------

    def run(self) -> str:
        self.study.set_user_attr("finished_because", None)  # running (again): an extended sweep is not finished
        self.study.set_user_attr("planned_trials", self.sweep.planned_trials)
        self._save_ran_s()
        self.reconcile()
        self.requeue_stopped()
        self._clock = time.monotonic()
        while True:
            self.account_time()
            optuna.storages.fail_stale_trials(self.study)  # workers whose heartbeat stopped: FAIL, then retried below
            self.poll()
            if self.on_look:
                self.on_look(self)
            attrs = self.study.user_attrs
            self.take_extension(attrs)
            if attrs.get("cancelled"):
                self.stop_all("cancelled by `trainforge sweep cancel`")
                return self.finish(CANCELLED)
            if self.out_of_time():
                self.stop_all(f"the sweep's wall time ({self.sweep.spec.budget.wall_time}) ran out")
                return self.finish("wall time reached")
            self.launch_what_fits()
            if not self.running:
                return self.finish(self.stopped_because or "all planned trials done")
            time.sleep(self.poll_s)

    def reconcile(self) -> None:
        """After a restart, from the study and the jobs alone: every trial not yet settled is settled once its job has
        ended, whoever watched it end (a trial that finished while no controller was up gets its cost, state and MLflow
        tags now); a job still alive is adopted and counts towards max_parallel, whatever its trial's state (a
        finished trial's job may still be tearing down); a trial asked for whose job was never created goes back to
        the queue with the same parameters, uncounted."""
        for trial in self.study.get_trials(deepcopy=False):
            if self.study.user_attrs.get(f"trial.{trial.number}.settled") or trial.state is TrialState.WAITING:
                continue
            job = trial.user_attrs.get("job")
            if job is None and trial.state is not TrialState.RUNNING:
                continue  # a record from before jobs were named first: nothing to settle
            state = self._job_state(job) if job else "missing"
            if state == "missing" and trial.state is TrialState.RUNNING and trial.user_attrs.get("launch") != "submitted":
                log.warning("trial %d: asked for, but its job was never created: its parameters go back to the queue", trial.number)
                self._give_back(self.study, trial.number, trial.params)
                self._mark_settled(trial.number)
            elif state in TERMINAL or state == "missing":
                self._settle(trial.number, access.trial_id(trial), job, state)
            else:
                log.info("trial %d: adopted its job %s (%s)", trial.number, job, state)
                self.running[trial.number] = (access.trial_id(trial), job)
        self._retry_failures()

    def requeue_stopped(self) -> None:
        """Trials an earlier start stopped on purpose (a cancel since resumed, a wall time since extended) were no fault
        of their own: continuing the sweep runs their parameters again, and the stopped ones no longer count."""
        trials = self.study.get_trials(deepcopy=False)
        retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
        for t in trials:
            if t.state is TrialState.FAIL and self.study.user_attrs.get(f"trial.{t.number}.stopped") and t.number not in retried:
                log.info("trial %d was stopped (%s): its parameters run again", t.number, self.study.user_attrs[f"trial.{t.number}.stopped"])
                self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def poll(self) -> None:
        for number, (trial_id, job) in list(self.running.items()):
            trial = access.stored_trial(self.study, trial_id)
            state = self._job_state(job)
            if trial.state is TrialState.FAIL and state not in TERMINAL and state != "missing":
                # Failed while its job runs on: a stale heartbeat (a worker hung or gone) or a diverged trial. End the job.
                self._cancel(job)
                state = "cancelled"
            if state in TERMINAL or state == "missing":
                self._settle(number, trial_id, job, state)
                del self.running[number]
                self._changed()
        self._retry_failures()

    def launch_what_fits(self) -> None:
        while len(self.running) < self.sweep.spec.max_parallel and not self.stopped_because:
            waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
            if counted(self.study) + len(self.running) >= self.sweep.planned_trials and not waiting:
                return
            if self.sweep.spec.sampler == "grid" and self.study.sampler.is_exhausted(self.study) and not waiting:
                return
            if not self._launch_one():
                return

    def _launch_one(self) -> bool:
        room = self._budget_room()
        if room:
            if room != "wait":
                self.stopped_because = room
            return False
        trial = self.study.ask(distributions(self.sweep))
        kill_point("asked")
        name = f"{self.sweep.name}-t{trial.number:03d}"
        # The intent first: a controller killed from here on leaves a trial that names its job, which a restart settles.
        trial.set_user_attr("job", name)
        trial.set_user_attr("launch", "intended")
        kill_point("intended")
        link = {"storage": self.trial_storage, "study": self.sweep.name, "trial_id": access.trial_id(trial), "trial_number": trial.number,
                "metric": self.sweep.spec.objective.metric, "heartbeat_s": HEARTBEAT_S}
        if self.tracking:
            link["parent_run_id"] = self.tracking.parent_run_id
        spec = trial_job(self.sweep.base, name, trial.params, link)
        decision = self.admit(spec)
        estimate = trial_estimate(spec, decision)
        if not decision.admitted:
            self.stopped_because = "a trial was not admitted: " + "; ".join(decision.problems)
            self._give_back(self.study, trial.number, trial.params)
            self._mark_settled(trial.number)
            return False
        trial.set_user_attr("estimate_usd", round(estimate, 6))
        kill_point("admitted")
        try:
            self.backend.submit(spec, decision, detach=True)
        except NotAdmitted as exc:  # the cluster said no (a held queue, a lower live quota): stop launching, say why
            self.stopped_because = "a trial was not admitted by the cluster: " + "; ".join(exc.problems)
            self._give_back(self.study, trial.number, trial.params)
            self._mark_settled(trial.number)
            return False
        kill_point("created")
        trial.set_user_attr("launch", "submitted")
        kill_point("recorded")
        log.info("trial %d: launched %s with %s", trial.number, name, json.dumps(trial.params))
        self.running[trial.number] = (access.trial_id(trial), name)
        self._changed()
        return True

    @staticmethod
    def _give_back(study: optuna.Study, number: int, params: dict[str, Any]) -> None:
        """A trial asked for but never started: its parameters go back to the queue (WAITING), so a later run of the
        sweep (a raised budget) starts exactly these; the asked one is failed and, being retried, not counted."""
        study.tell(number, state=TrialState.FAIL)
        study.enqueue_trial(params, user_attrs={"retry_of": number, "never_started": True})

    def _mark_settled(self, number: int) -> None:
        self.study.set_user_attr(f"trial.{number}.settled", True)

    # ---- settling a trial --------------------------------------------------------------------------------------

    def _job_state(self, job: str) -> str:
        try:
            return self.backend.status(job).state
        except NoSuchJob:
            return "missing"

    def _settle(self, number: int, trial_id: int, job: str | None, job_state: str) -> None:
        """Once per trial, whoever sees its job end: state, cost, MLflow."""
        if self.study.user_attrs.get(f"trial.{number}.settled"):
            return
        trial = access.stored_trial(self.study, trial_id)
        kill_point("settling")
        cost, seconds = self._cost(job, trial)
        if trial.state is TrialState.RUNNING:
            reported = trial.user_attrs.get(OBJECTIVE_VALUE_ATTR)
            if is_multi_objective(self.study) and reported is not None and job_state == "succeeded":
                # The worker reported its metric; what it cost is known only now, so the controller tells both.
                self.study.tell(number, [float(reported), self._second_value(cost, seconds, trial)])
            else:
                # The worker tells the study how its trial ended; a job that ended without telling it failed.
                self.study.tell(number, state=TrialState.FAIL)
                log.warning("trial %d: job %s ended %s without reporting an outcome: failed", number, job, job_state)
        self.study.set_user_attr(f"trial.{number}.cost_usd", round(cost, 6))
        if seconds is not None:
            self.study.set_user_attr(f"trial.{number}.run_s", round(seconds, 3))
        if self.tracking:
            run_id = self.tracking.trial_finished(access.stored_trial(self.study, trial_id), job, cost)
            if run_id:
                self.study.set_user_attr(f"trial.{number}.mlflow_run_id", run_id)
        self._mark_settled(number)

    def _second_value(self, cost: float, seconds: float | None, trial: optuna.trial.FrozenTrial) -> float:
        if self.sweep.spec.second_objective.metric == "cost_usd":
            return round(cost, 6)
        if seconds is not None:
            return round(seconds, 3)
        return round((time.time() - trial.datetime_start.timestamp()), 3) if trial.datetime_start else 0.0

    def _cost(self, job: str | None, trial: optuna.trial.FrozenTrial) -> tuple[float, float | None]:
        """What the trial's job cost: the backend's own figure where it keeps one (local: node-hours x price), else
        the estimate scaled by how long the trial ran."""
        if job is None:
            return 0.0, None
        report = None
        try:
            report = self.backend.status(job)
        except NoSuchJob:
            pass
        details = report.details if report is not None else {}
        priced = (details.get("cost") or {}).get("cost_usd")  # the local backend's ledger: node-hours x price
        if priced is not None:
            return float(priced), details.get("run_seconds")
        estimate = float(trial.user_attrs.get("estimate_usd", 0.0))
        ended = trial.datetime_complete or (datetime.datetime.now() if trial.datetime_start else None)  # a trial the controller tells
        ran = (ended - trial.datetime_start).total_seconds() if ended and trial.datetime_start else None
        max_runtime_s = self.sweep.base.limits.max_runtime_hours * 3600
        return (estimate * min(1.0, ran / max_runtime_s) if ran is not None else estimate), ran

    def _retry_failures(self) -> None:
        """Each failed trial is retried once, with the same parameters (a retry that fails stays failed)."""
        trials = self.study.get_trials(deepcopy=False)
        retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
        for t in trials:
            if t.state is TrialState.FAIL and "retry_of" not in t.user_attrs and t.number not in retried and "job" in t.user_attrs \
                    and not self.study.user_attrs.get(f"trial.{t.number}.stopped"):
                log.warning("trial %d failed: retrying it once with the same parameters", t.number)
                self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    # ---- limits ------------------------------------------------------------------------------------------------

    def spent_usd(self) -> float:
        return sum(v for k, v in self.study.user_attrs.items() if k.startswith("trial.") and k.endswith(".cost_usd"))

    def committed_usd(self) -> float:
        return sum(float(access.stored_trial(self.study, tid).user_attrs.get("estimate_usd", 0.0)) for tid, _ in self.running.values())

    def per_trial_usd(self) -> float:
        """A trial's most: its max_runtime on the dearest instance type and capacity it could draw (the base's, unless
        the sweep searches them)."""
        if self._per_trial is None:
            import itertools

            from trainforge.trainer.sweeps.spec import INFRA_FIELDS, infra_job
            searched = {k: p.choices for k, p in self.sweep.spec.space.items() if k in INFRA_FIELDS}
            placements = [infra_job(self.sweep.base, dict(zip(searched, c))) for c in itertools.product(*searched.values())]
            self._per_trial = max(trial_estimate(spec, self.admit(spec)) for spec in placements)
        return self._per_trial

    def _budget_room(self) -> str:
        """'' if a trial may start now; 'wait' while running trials' estimates leave no room (they may end cheaper);
        the reason, once even an idle sweep could not afford one more trial."""
        budget = self.sweep.spec.budget.usd
        if budget is None:
            return ""
        spent, committed, estimate = self.spent_usd(), self.committed_usd(), self.per_trial_usd()
        if spent + estimate > budget:
            return (f"the USD budget: ${spent:,.4f} spent + a trial's ${estimate:,.4f} estimate ({self.sweep.base.limits.max_runtime} "
                    f"at most) would pass ${budget:,.2f}")
        return "wait" if spent + committed + estimate > budget else ""

    def out_of_time(self) -> bool:
        limit = self.sweep.spec.budget.wall_time_s
        return limit is not None and self.ran_s > limit

    def stop_all(self, why: str) -> None:
        self.stopped_because = why
        for number, (trial_id, job) in list(self.running.items()):
            self.study.set_user_attr(f"trial.{number}.stopped", why)  # stopped on purpose: not retried
            self._cancel(job)
            self._settle(number, trial_id, job, "cancelled")
            del self.running[number]

    def _cancel(self, job: str) -> None:
        try:
            self.backend.cancel(job)
        except TrainforgeError as exc:  # gone already, or ended on its own meanwhile
            log.info("cancelling %s: %s", job, exc)

    def finish(self, why: str) -> str:
        self.account_time()
        self._save_ran_s()
        self.study.set_user_attr("finished_because", why)
        if self.tracking:
            self.tracking.sweep_finished(self.study, self.spent_usd(), why)
        self._changed()
        return why

    def _changed(self) -> None:
        if self.on_change:
            self.on_change(self)


class _Tracking:
    """The sweep's parent run in MLflow; each trial's own run (created by its rank 0) is nested under it."""

    def __init__(self, uri: str, sweep: Sweep, study: optuna.Study):
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient(uri)
        self.team = sweep.base.team
        self.parent_run_id = study.user_attrs.get("mlflow_run_id")
        if self.parent_run_id is None:
            name = contract.team_experiment(sweep.base.team, sweep.base.tracking.experiment)  # where its trials' runs are
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run = self.client.create_run(experiment_id, run_name=sweep.name,
                                         tags={contract.TRACKING_SWEEP_TAG: sweep.name, contract.TRACKING_TEAM_TAG: sweep.base.team})
            self.parent_run_id = run.info.run_id
            study.set_user_attr("mlflow_run_id", self.parent_run_id)
            spec = sweep.spec
            params = {"sampler": spec.sampler, "pruner": spec.pruner.type, "max_trials": spec.max_trials, "max_parallel": spec.max_parallel,
                      "objective": f"{spec.objective.metric} ({sweep.direction})", "seed": spec.seed,
                      "space": json.dumps({k: v.model_dump() for k, v in spec.space.items()})[:6000]}
            for key, value in params.items():
                self.client.log_param(self.parent_run_id, key, value)

    def trial_finished(self, trial: optuna.trial.FrozenTrial, job: str | None, cost: float) -> str | None:
        """Log the trial on the parent run and tag its own run; the trial's run id, where it has one."""
        self.client.log_metric(self.parent_run_id, "trial_cost_usd", cost, step=trial.number)
        value = trial.values[0] if trial.values else None
        if value is not None:
            self.client.log_metric(self.parent_run_id, "trial_value", value, step=trial.number)
        found = self.client.search_runs([self.client.get_run(self.parent_run_id).info.experiment_id],
                                        filter_string=f"tags.`{contract.TRACKING_JOB_TAG}` = '{job}' and "
                                                      f"tags.`{contract.TRACKING_TEAM_TAG}` = '{self.team}'", max_results=1) if job else []
        for run in found:
            for key, value in {"trainforge.trial.number": trial.number, "trainforge.trial.state": trial.state.name.lower(),
                               "trainforge.trial.cost_usd": f"{cost:.6f}", "trainforge.trial.value": value}.items():
                self.client.set_tag(run.info.run_id, key, str(value))
        return found[0].info.run_id if found else None

    def sweep_finished(self, study: optuna.Study, spent: float, why: str) -> None:
        self.client.set_tag(self.parent_run_id, "trainforge.sweep.finished_because", why)
        self.client.log_metric(self.parent_run_id, "spent_usd", spent)
        front = best_trials(study)
        if front:
            best = front[0]
            self.client.log_metric(self.parent_run_id, "best_value", best.values[0])
            self.client.set_tag(self.parent_run_id, "trainforge.sweep.best_trial", str(best.number))
            self.client.set_tag(self.parent_run_id, "trainforge.sweep.best_job", str(best.user_attrs.get("job")))
        self.client.set_terminated(self.parent_run_id, "FINISHED")
