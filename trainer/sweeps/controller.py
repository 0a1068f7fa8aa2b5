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
import time
from typing import Any, Callable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from trainforge.errors import TrainforgeError
from trainforge.trainer.admission import Admission, NotAdmitted
from trainforge.trainer.backends import JobPhase, JobReport, NoSuchJob
from trainforge.trainer.runtime.pruning import OBJECTIVE_VALUE_ATTR
from trainforge.trainer.spec import JobSpec
from trainforge.trainer.sweeps import optuna_access as access
from trainforge.trainer.sweeps import run_clock
from trainforge.trainer.sweeps.limits import in_effect, take_up_asked
from trainforge.trainer.sweeps.spec import Sweep
from trainforge.trainer.sweeps.trials import trial_job
from trainforge.trainer.sweeps.study import HEARTBEAT_S, counted, distributions, is_multi_objective, open_study
from trainforge.trainer.sweeps.costs import trial_cost, trial_estimate
from trainforge.trainer.sweeps.faults import kill_point
from trainforge.trainer.sweeps.outages import GIVE_UP_AFTER_S, Outage, is_transient
from trainforge.trainer.sweeps.tracking import SweepTracking
from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, TrialKey, fact_key, fact_of

log = logging.getLogger("trainforge.sweeps")
TERMINAL = frozenset(s for s in JobPhase if s.ended)  # whoever reports it: local (lost: its supervisor gone) or cluster


CANCELLED = "cancelled"  # the controller's answer when `trainforge sweep cancel` stopped it


RAN_SAVE_S = 5.0  # how often the time the sweep ran is written to the study (a kill loses at most this much)


class SweepController:
    def __init__(self, sweep: Sweep, backend: Any, admit: Callable[[JobSpec], Admission], storage_url: str,
                 tracking_uri: str | None = None, poll_s: float = 1.0, on_change: Callable[[SweepController], None] | None = None,
                 trial_storage: str | None = None, resume: bool = False, on_look: Callable[[SweepController], None] | None = None,
                 give_up_after_s: float = GIVE_UP_AFTER_S, before_launch: Callable[[], object] = lambda: None):
        """`resume`: continue a cancelled sweep on purpose. `trial_storage`: how trials name the study's storage, where they see it differently (on the cluster: the
        team's Secret mounted as a file, `file:/var/run/trainforge/sweep-database/storage`); default: the same URL.
        `before_launch`: called right before each admitted trial's job is submitted (a local sweep waits there for its
        warm worker interpreter, so a sweep refused before its first trial never waits for it)."""
        self.given, self.backend, self.admit, self.storage_url = sweep, backend, admit, storage_url
        self.before_launch = before_launch
        self.trial_storage = trial_storage or storage_url
        self.poll_s, self.on_change, self.on_look = poll_s, on_change, on_look  # on_look: each look (the cluster's requests)
        self.outage = Outage(give_up_after_s)
        self.study = open_study(sweep, storage_url, resume=resume)
        self.sweep = in_effect(sweep, self.study)
        self._extension = self.study.user_attrs.get(StudyKey.EXTENDED)
        self.running: dict[int, tuple[int, str]] = {}  # trial number -> (trial id, job name)
        # The run clocks' study attributes (run_clock), mirrored: this controller alone writes them, and reading the
        # study's attributes each look is a query over all of them (thousands of rows in a large sweep).
        self.clocks: dict[str, Any] = {}
        self.stopped_because = ""
        self._per_trial: float | None = None
        self.tracking = SweepTracking(tracking_uri, sweep, self.study) if tracking_uri else None
        # The wall time counts the time a controller ran the sweep, over every start: time with no controller up (a
        # crash, a laptop asleep) is not the sweep's. Kept in the study, saved every RAN_SAVE_S.
        self.ran_s = float(self.study.user_attrs.get(StudyKey.RAN_S, 0.0))
        self._clock = time.monotonic()
        self._saved_ran_s = self.ran_s

    def account_time(self) -> None:
        now = time.monotonic()
        self.ran_s += now - self._clock
        self._clock = now
        if self.ran_s - self._saved_ran_s >= RAN_SAVE_S:
            self._save_ran_s()

    def _save_ran_s(self) -> None:
        self.study.set_user_attr(StudyKey.RAN_S, self.ran_s)
        self.study.set_user_attr(StudyKey.CONTROLLER_SEEN_AT, time.time())  # `extend` tells whether a controller will take it up
        self._saved_ran_s = self.ran_s

    def take_extension(self, attrs: dict[str, Any]) -> None:
        """Limits raised by `trainforge sweep extend` while this controller runs: in effect from this look on; a sweep
        that had stopped launching for its budget launches again."""
        if attrs.get(StudyKey.EXTENDED) == self._extension:
            return
        self._extension = attrs.get(StudyKey.EXTENDED)
        self.sweep = in_effect(self.given, self.study)
        self.study.set_user_attr(StudyKey.PLANNED_TRIALS, self.sweep.planned_trials)
        if self.stopped_because.startswith("the USD budget"):
            self.stopped_because = ""
        log.info("extended: %d trials, budget %s, wall time %s", self.sweep.spec.max_trials, self.sweep.spec.budget.usd,
                 self.sweep.spec.budget.wall_time)
        self._changed()

    # ---- the loop ----------------------------------------------------------------------------------------------

    def run(self) -> str:
        """Look until the sweep ends. A look that a service fails (outages.is_transient) is retried with backoff; the
        look after an outage starts from the study and the jobs again (reconcile), since a launch or a settle may have
        stopped halfway; an outage past the patience raises outages.ServicesDown."""
        starting = True
        while True:
            try:
                if starting:
                    self._start()
                    starting = False
                elif self.outage.ongoing:
                    self.reconcile()
                why = self._look()
                self.outage.over()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                time.sleep(self.outage.failed(exc, self.poll_s))
                continue
            if why is not None:
                return why
            time.sleep(self.poll_s)

    def _start(self) -> None:
        self.study.set_user_attr(StudyKey.FINISHED_BECAUSE, None)  # running (again): an extended sweep is not finished
        self.study.set_user_attr(StudyKey.PLANNED_TRIALS, self.sweep.planned_trials)
        self._save_ran_s()
        self.reconcile()
        self.requeue_stopped()
        self._clock = time.monotonic()

    def _look(self) -> str | None:
        """One look: the jobs, a member's requests, the limits, launches. Why the sweep ended, or None while it runs."""
        self.account_time()
        # No stale-heartbeat check (Optuna's fail_stale_trials): a trial whose worker went silent because its job was
        # suspended, requeued, waiting for nodes or restarting is waiting, and resumes from its own checkpoints under
        # its own job. Only its job's end settles it (poll): a job that ended without the trial telling the study
        # failed it. A hung worker is bounded by the trial job's max_runtime.
        self.poll()
        if self.on_look:
            self.on_look(self)
        attrs = self.study.user_attrs
        if take_up_asked(self.study, attrs):  # extensions asked of a sweep on this machine (or its shared database)
            attrs = self.study.user_attrs
        self.take_extension(attrs)
        if attrs.get(StudyKey.CANCELLED):
            self.stop_all("cancelled by `trainforge sweep cancel`")
            return self.finish(CANCELLED)
        if self.out_of_time():
            self.stop_all(f"the sweep's wall time ({self.sweep.spec.budget.wall_time}) ran out")
            return self.finish("wall time reached")
        self.launch_what_fits()
        if not self.running:
            return self.finish(self.stopped_because or "all planned trials done")
        return None

    def reconcile(self) -> None:
        """After a restart, from the study and the jobs alone: every trial not yet settled is settled once its job has
        ended, whoever watched it end (a trial that finished while no controller was up gets its cost, state and MLflow
        tags now); a job still alive is adopted and counts towards max_parallel, whatever its trial's state (a
        finished trial's job may still be tearing down); a trial asked for whose job was never created goes back to
        the queue with the same parameters, uncounted. The study's attributes are read once: on a database storage each
        read is a query over all of them, and once per trial made a restart quadratic (58 s at 1,000 trials)."""
        attrs = self.study.user_attrs
        self.clocks = run_clock.clocks_of(attrs)
        for trial in self.study.get_trials(deepcopy=False):
            if attrs.get(fact_key(trial.number, TrialFact.SETTLED)) or trial.state is TrialState.WAITING:
                continue
            job = trial.user_attrs.get(TrialKey.JOB)
            if job is None and trial.state is not TrialState.RUNNING:
                continue  # a record from before jobs were named first: nothing to settle
            report = self._job_report(job) if job else None
            state = report.state if report else "missing"
            if state == "missing" and trial.state is TrialState.RUNNING and trial.user_attrs.get(TrialKey.LAUNCH) != "submitted":
                log.warning("trial %d: asked for, but its job was never created: its parameters go back to the queue", trial.number)
                self._give_back(self.study, trial.number, trial.params)
                self._mark_settled(trial.number)
            elif state in TERMINAL or state == "missing":
                self._settle(trial.number, access.trial_id(trial), job, state, settled=False, report=report)
            else:
                log.info("trial %d: adopted its job %s (%s)", trial.number, job, state)
                self.running[trial.number] = (access.trial_id(trial), str(job))  # alive: it has a job
                self._time(trial.number, trial, report)
        self._retry_failures(attrs)

    def requeue_stopped(self) -> None:
        """Trials an earlier start stopped on purpose (a cancel since resumed, a wall time since extended) were no fault
        of their own: continuing the sweep runs their parameters again, and the stopped ones no longer count."""
        trials, attrs = self.study.get_trials(deepcopy=False), self.study.user_attrs
        retried = {t.user_attrs[TrialKey.RETRY_OF] for t in trials if TrialKey.RETRY_OF in t.user_attrs}
        for t in trials:
            if t.state is TrialState.FAIL and attrs.get(fact_key(t.number, TrialFact.STOPPED)) and t.number not in retried:
                log.info("trial %d was stopped (%s): its parameters run again", t.number, attrs[fact_key(t.number, TrialFact.STOPPED)])
                self.study.enqueue_trial(t.params, user_attrs={TrialKey.RETRY_OF: t.number})

    def poll(self) -> None:
        for number, (trial_id, job) in list(self.running.items()):
            trial = access.stored_trial(self.study, trial_id)
            report = self._job_report(job)
            state = report.state if report else "missing"
            if trial.state is TrialState.FAIL and state not in TERMINAL and state != "missing":
                # Failed while its job runs on (a diverged trial, or failed by someone else): end the job.
                self._cancel(job)
                state, report = "cancelled", None
            if state in TERMINAL or state == "missing":
                self._settle(number, trial_id, job, state, report=report)
                del self.running[number]
                self._changed()
            else:
                self._time(number, trial, report)
        self._retry_failures()

    def launch_what_fits(self) -> None:
        while len(self.running) < self.sweep.spec.max_parallel and not self.stopped_because:
            waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
            if counted(self.study) + len(self.running) >= self.sweep.planned_trials and not waiting:
                return
            if self.sweep.spec.sampler == "grid" and access.grid_exhausted(self.study) and not waiting:
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
        trial.set_user_attr(TrialKey.JOB, name)
        trial.set_user_attr(TrialKey.LAUNCH, "intended")
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
        trial.set_user_attr(TrialKey.ESTIMATE_USD, round(estimate, 6))
        kill_point("admitted")
        self.before_launch()
        try:
            self.backend.submit(spec, decision, detach=True)
        except NotAdmitted as exc:  # the cluster said no (a held queue, a lower live quota): stop launching, say why
            self.stopped_because = "a trial was not admitted by the cluster: " + "; ".join(exc.problems)
            self._give_back(self.study, trial.number, trial.params)
            self._mark_settled(trial.number)
            return False
        kill_point("created")
        self._record_submitted(trial)
        kill_point("recorded")
        log.info("trial %d: launched %s with %s", trial.number, name, json.dumps(trial.params))
        self.running[trial.number] = (access.trial_id(trial), name)
        self._changed()
        return True

    @staticmethod
    def _record_submitted(trial: optuna.Trial) -> None:
        """Its job exists. The trial may already have run and told the study how it ended (a trial that fails at once,
        a controller slowed between the create and this line): a finished trial was submitted, nothing to record."""
        try:
            trial.set_user_attr(TrialKey.LAUNCH, "submitted")
        except UpdateFinishedTrialError:
            log.info("trial %d: its job ended and told the study before its launch was recorded", trial.number)

    @staticmethod
    def _give_back(study: optuna.Study, number: int, params: dict[str, Any]) -> None:
        """A trial asked for but never started: its parameters go back to the queue (WAITING), so a later run of the
        sweep (a raised budget) starts exactly these; the asked one is failed and, being retried, not counted."""
        study.tell(number, state=TrialState.FAIL)
        study.enqueue_trial(params, user_attrs={TrialKey.RETRY_OF: number, TrialKey.NEVER_STARTED: True})

    def _mark_settled(self, number: int) -> None:
        self.study.set_user_attr(fact_key(number, TrialFact.SETTLED), True)

    # ---- settling a trial --------------------------------------------------------------------------------------

    def _job_report(self, job: str) -> JobReport | None:
        try:
            return self.backend.status(job)
        except NoSuchJob:
            return None

    def _time(self, number: int, trial: optuna.trial.FrozenTrial, report: JobReport | None) -> run_clock.Seen:
        """The trial's run clock after a look at its job (run_clock): written when it starts or stops running."""
        started = trial.datetime_start.timestamp() if trial.datetime_start else None
        look = run_clock.seen(report, time.time())
        changed = run_clock.observe(self.clocks, number, look, started)
        if changed:
            log.info("trial %d: %s since %s (its job %s)", number, "running" if look.running else "not running",
                     datetime.datetime.fromtimestamp(look.at, datetime.timezone.utc).isoformat(timespec="seconds"),
                     report.state if report else "gone")
        for key, value in changed.items():
            self.study.set_user_attr(key, value)
        self.clocks.update(changed)
        return look

    def _settle(self, number: int, trial_id: int, job: str | None, job_state: str, settled: bool | None = None,
                report: JobReport | None = None) -> None:
        """Once per trial, whoever sees its job end: state, cost, MLflow. `settled`: whether it is, where the caller
        has just read it (else it is read here); `report`: the look at its job that saw it end (else one is taken)."""
        if settled if settled is not None else self.study.user_attrs.get(fact_key(number, TrialFact.SETTLED)):
            return
        trial = access.stored_trial(self.study, trial_id)
        kill_point("settling")
        if report is None and job is not None and job_state not in ("missing", "cancelled"):
            report = self._job_report(job)
        last = self._time(number, trial, report)
        cost, seconds = (trial_cost(report, trial, self.sweep.base.limits.max_runtime_hours, run_clock.ran_s(self.clocks, number, last))
                         if job is not None else (0.0, None))
        if trial.state is TrialState.RUNNING:
            reported = trial.user_attrs.get(OBJECTIVE_VALUE_ATTR)
            if is_multi_objective(self.study) and reported is not None and job_state == JobPhase.SUCCEEDED:
                # The worker reported its metric; what it cost is known only now, so the controller tells both.
                self.study.tell(number, [float(reported), self._second_value(cost, seconds, trial)], skip_if_finished=True)
            else:
                # The worker tells the study how its trial ended; a job that ended without telling it failed. A worker
                # still running (stop_all cancels it) may tell it first: its word stands.
                self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
                log.warning("trial %d: job %s ended %s without reporting an outcome: failed", number, job, job_state)
        self.study.set_user_attr(fact_key(number, TrialFact.COST_USD), round(cost, 6))
        if seconds is not None:
            self.study.set_user_attr(fact_key(number, TrialFact.RUN_S), round(seconds, 3))
        if self.tracking:
            run_id = self.tracking.trial_finished(access.stored_trial(self.study, trial_id), job, cost)
            if run_id:
                self.study.set_user_attr(fact_key(number, TrialFact.MLFLOW_RUN_ID), run_id)
        self._mark_settled(number)

    def _second_value(self, cost: float, seconds: float | None, trial: optuna.trial.FrozenTrial) -> float:
        second = self.sweep.spec.second_objective
        if second is not None and second.metric == "cost_usd":
            return round(cost, 6)
        if seconds is not None:
            return round(seconds, 3)
        return round((time.time() - trial.datetime_start.timestamp()), 3) if trial.datetime_start else 0.0

    def _retry_failures(self, attrs: dict[str, Any] | None = None) -> None:
        """Each failed trial is retried once, with the same parameters (a retry that fails stays failed). `attrs`: the
        study's attributes where the caller has just read them."""
        trials = self.study.get_trials(deepcopy=False)
        attrs = self.study.user_attrs if attrs is None else attrs
        retried = {t.user_attrs[TrialKey.RETRY_OF] for t in trials if TrialKey.RETRY_OF in t.user_attrs}
        for t in trials:
            if t.state is TrialState.FAIL and TrialKey.RETRY_OF not in t.user_attrs and t.number not in retried and TrialKey.JOB in t.user_attrs \
                    and not attrs.get(fact_key(t.number, TrialFact.STOPPED)):
                log.warning("trial %d failed: retrying it once with the same parameters", t.number)
                self.study.enqueue_trial(t.params, user_attrs={TrialKey.RETRY_OF: t.number})

    # ---- limits ------------------------------------------------------------------------------------------------

    def spent_usd(self) -> float:
        return sum(v for k, v in self.study.user_attrs.items() if (fact := fact_of(k)) is not None and fact[1] is TrialFact.COST_USD)

    def committed_usd(self) -> float:
        return sum(float(access.stored_trial(self.study, tid).user_attrs.get(TrialKey.ESTIMATE_USD, 0.0)) for tid, _ in self.running.values())

    def per_trial_usd(self) -> float:
        """A trial's most: its max_runtime on the dearest instance type and capacity it could draw (the base's, unless
        the sweep searches them)."""
        if self._per_trial is None:
            import itertools

            from trainforge.trainer.sweeps.trials import INFRA_FIELDS, placed_as
            searched = {k: p.values() or [] for k, p in self.sweep.spec.space.items() if k in INFRA_FIELDS}  # categorical: checks.py
            placements = [placed_as(self.sweep.base, dict(zip(searched, c))) for c in itertools.product(*searched.values())]
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
            self.study.set_user_attr(fact_key(number, TrialFact.STOPPED), why)  # stopped on purpose: not retried
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
        self.study.set_user_attr(StudyKey.FINISHED_BECAUSE, why)
        if self.tracking:
            self.tracking.sweep_finished(self.study, self.spent_usd(), why)
        self._changed()
        return why

    def _changed(self) -> None:
        if self.on_change:
            self.on_change(self)


