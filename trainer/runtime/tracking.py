"""Experiment tracking in MLflow, from rank 0 only, never in the training loop's way.

Every call only appends to a buffer; a background thread sends batches to the tracking server. While the
server is unreachable the buffer keeps everything, the thread retries with backoff and warns once per
outage. A job has exactly one MLflow run however many times it restarts: the run is found again by its
`trainforge.job_id` and `trainforge.team` tags, in its team's experiment (`<team>/<experiment>`): two teams' jobs of
one name never meet. On the platform the client signs in as the team's MLflow user (MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD from the team's Secret) and can reach only experiments the team created.

The experiment is found by name, so before logging anything the tracker makes sure it is the team's own: one it just
created, or one its user MANAGEs. An experiment of that name that another user made (squatted before the platform's
auth app refused foreign names, or on a server without it) would hand every run to its owner; one the team cannot
read would leave tracking silently buffering for ever. Either is refused: the job fails with exit 2 (a user error)
naming the experiment and the fix, at its first contact with the server or at the next log once it is reachable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from trainforge import run_tags
from trainforge.trainer.runtime.config import UserError

log = logging.getLogger("trainforge.runtime")
JOB_TAG = run_tags.JOB
TEAM_TAG = run_tags.TEAM
MAX_BATCH = 900  # MLflow accepts 1000 metrics per log_batch
PERMISSION_PATH = "/api/3.0/mlflow/users/permissions/get"  # the auth app's: a user may ask about itself


class ForeignExperiment(Exception):
    """The team's experiment name is held by someone else: never retried, never logged into."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:6000]
    return out


def _refusal(uri: str, experiment: str, team: str, detail: str) -> str:
    return (f"MLflow experiment {experiment!r} at {uri} is not team {team}'s: {detail}. Nothing was logged into it. Fix: "
            "a platform admin deletes or renames that experiment (another user made it), or set tracking.experiment to a "
            "name of your own")


def owned_experiment(client: Any, uri: str, name: str, team: str) -> str:
    """The id of the team's experiment `name`, created if it does not exist yet; ForeignExperiment if the name is held
    by another user (one the signed-in user cannot read, or does not MANAGE: what its creator gets). A server without
    users (no auth app) has no owners to check."""
    from mlflow.exceptions import MlflowException
    try:
        experiment = client.get_experiment_by_name(name)
    except MlflowException as e:
        if e.error_code == "PERMISSION_DENIED" or e.get_http_status_code() == 403:
            raise ForeignExperiment(_refusal(uri, name, team, "it exists and this team's MLflow user may not read it")) from None
        raise
    if experiment is None:
        return client.create_experiment(name)  # its creator MANAGEs it
    import requests
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not user or not password:
        return experiment.experiment_id
    answer = requests.get(uri.rstrip("/") + PERMISSION_PATH, auth=(user, password),
                          params={"username": user, "resource_type": "experiment", "resource_id": experiment.experiment_id},
                          timeout=float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")))
    if answer.status_code == 404:
        return experiment.experiment_id  # no permissions API: the server runs without an auth app
    answer.raise_for_status()
    level = answer.json().get("permission")
    if level != "MANAGE":
        raise ForeignExperiment(_refusal(uri, name, team, f"its user {user} has {level} on it, not MANAGE: another user made it"))
    return experiment.experiment_id


class Tracker:
    def __init__(self, uri: str, experiment: str, *, job_id: str, team: str, run_name: str, params: dict[str, str],
                 tags: dict[str, str], max_backoff_s: float = 30.0):
        # Our thread owns retrying: MLflow's own HTTP retries would hold the buffer hostage for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        self.uri, self.experiment, self.job_id, self.team, self.run_name = uri, run_tags.team_experiment(team, experiment), job_id, team, run_name
        self._params, self._tags = dict(params), {**tags, JOB_TAG: job_id, TEAM_TAG: team}
        self._metrics: list[tuple[str, float, int, int]] = []
        self._pending_tags: dict[str, str] = {}
        self.run_id: str | None = None
        self.max_backoff_s = max_backoff_s
        self._cv = threading.Condition()
        self._closing = False
        self._status = "FINISHED"
        self.refused: str | None = None  # why the experiment is not the team's (tracking stopped)
        self._first_contact = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainforge-tracking", daemon=True)
        self._thread.start()

    # ---- called from the training loop (never blocks on the network) ----------------------------------

    def wait_for_first_contact(self, timeout: float) -> None:
        """Until the first attempt to reach the server has ended (either way), at most `timeout` s; raises UserError
        if the experiment turned out not to be the team's."""
        self._first_contact.wait(timeout)
        self._raise_if_refused()

    def _raise_if_refused(self) -> None:
        if self.refused is not None:
            raise UserError(self.refused)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._raise_if_refused()
        now = int(time.time() * 1000)
        with self._cv:
            self._metrics.extend((k, float(v), now, step) for k, v in metrics.items())
            self._cv.notify()

    def set_tags(self, tags: dict[str, str]) -> None:
        if self.refused is not None:
            return  # called from a checkpoint commit: the commit stands; the next log_metrics fails the job
        with self._cv:
            self._pending_tags.update(tags)
            self._cv.notify()

    def buffered(self) -> int:
        with self._cv:
            return len(self._metrics) + len(self._pending_tags)

    def close(self, status: str = "FINISHED", timeout: float = 30.0) -> bool:
        """Flush and end the run; False if the server stayed unreachable for `timeout` (data is then lost)."""
        with self._cv:
            self._status, self._closing = status, True
            self._cv.notify()
        self._thread.join(timeout)
        if self.refused is not None:
            return False
        if self._thread.is_alive():
            log.warning("MLflow at %s unreachable; %d buffered records not recorded", self.uri, self.buffered())
            return False
        return True

    # ---- background ------------------------------------------------------------------------------------

    def _client(self):
        from mlflow import MlflowClient
        return MlflowClient(tracking_uri=self.uri)

    def _ensure_run(self, client) -> str:
        if self.run_id is not None:
            return self.run_id
        experiment_id = owned_experiment(client, self.uri, self.experiment, self.team)
        found = client.search_runs([experiment_id], filter_string=f"tags.`{JOB_TAG}` = '{self.job_id}' and tags.`{TEAM_TAG}` = '{self.team}'",
                                   max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            run = client.create_run(experiment_id, run_name=self.run_name, tags=self._tags)
            self.run_id = run.info.run_id
            from mlflow.entities import Param
            items = [Param(k, v) for k, v in sorted(self._params.items())]
            for i in range(0, len(items), 100):
                client.log_batch(self.run_id, params=items[i:i + 100])
        log.info("MLflow run %s for job %s at %s", self.run_id, self.job_id, self.uri)
        return self.run_id

    def _drain(self, client, run_id: str) -> None:
        from mlflow.entities import Metric, RunTag
        with self._cv:
            metrics, self._metrics = self._metrics[:MAX_BATCH], self._metrics[MAX_BATCH:]
            tags, self._pending_tags = self._pending_tags, {}
        try:
            client.log_batch(run_id, metrics=[Metric(k, v, ts, s) for k, v, ts, s in metrics],
                             tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception:
            with self._cv:  # put them back, in order, for the next attempt
                self._metrics[:0] = metrics
                self._pending_tags = {**tags, **self._pending_tags}
            raise

    def _run(self) -> None:
        client, backoff, outage_since = None, 1.0, None
        while True:
            with self._cv:
                while not (self._metrics or self._pending_tags or self._closing or self.run_id is None):
                    self._cv.wait()
                closing = self._closing
            try:
                client = client or self._client()
                try:
                    run_id = self._ensure_run(client)
                finally:
                    self._first_contact.set()
                while self.buffered():
                    self._drain(client, run_id)
                if closing:
                    client.set_terminated(run_id, status=self._status)
                    return
                if outage_since is not None:
                    log.warning("MLflow at %s reachable again after %.0f s; buffer flushed", self.uri, time.time() - outage_since)
                    outage_since, backoff = None, 1.0
                with self._cv:
                    self._cv.wait(1.0)  # batch what arrives over the next second
            except ForeignExperiment as refused:
                log.error("%s", refused)
                with self._cv:
                    self.refused = str(refused)
                    self._metrics, self._pending_tags = [], {}
                return
            except Exception as exc:  # noqa: BLE001 - any tracking failure must stay out of training
                if outage_since is None:
                    outage_since = time.time()
                    log.warning("MLflow at %s unreachable (%s); buffering %d records and retrying", self.uri,
                                type(exc).__name__, self.buffered())
                with self._cv:
                    self._cv.wait(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
