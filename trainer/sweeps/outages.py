"""What a sweep controller does when a service it needs stops answering for a while: the Kubernetes API (a blip, a
429, a control-plane upgrade), the study's database (a failover, a lock) or MLflow. It retries with backoff inside
its loop; only an outage longer than its patience ends it, with an exit code the runtime restarts
(exits.EXIT_SERVICES_DOWN, >= 128), and the restarted controller continues from the study and the jobs."""

from __future__ import annotations

import logging
import random
import time

from trainforge import exits
from trainforge.exits import ServicesDown

log = logging.getLogger("trainforge.sweeps")

GIVE_UP_AFTER_S = 900.0  # an outage this long ends the controller (its pod restarts it, fresh connections and all)
BACKOFF_MAX_S = 60.0
_RETRYABLE_HTTP = frozenset({408, 409, 425, 429})  # timeout, a conflicting write, too early, too many requests



def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is a service that did not answer (worth a retry), not a refusal or a bug."""
    from trainforge.trainer.kube import ClusterError
    if isinstance(exc, ClusterError):
        return exc.status is None or exc.status in _RETRYABLE_HTTP or exc.status >= 500
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return database_outage(exc) or _tracking_outage(exc)


def database_outage(exc: BaseException) -> bool:
    """The study's database did not answer (a failover, a restart, a lock held too long), as opposed to refusing."""
    import optuna
    from sqlalchemy import exc as sa
    unreachable = (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError, sa.TimeoutError)
    if isinstance(exc, unreachable):
        return True
    # Optuna wraps a failed commit; only a connection's failure under it is an outage (bad data is not).
    return isinstance(exc, optuna.exceptions.StorageInternalError) and isinstance(exc.__cause__, unreachable)


def _tracking_outage(exc: BaseException) -> bool:
    try:
        from mlflow.exceptions import MlflowException
        from requests import exceptions as http
    except ImportError:  # the tracking extra is not installed: nothing of it can fail
        return False
    if isinstance(exc, (http.ConnectionError, http.Timeout)):
        return True
    return isinstance(exc, MlflowException) and exc.error_code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "INTERNAL_ERROR")


class Outage:
    """Consecutive failed looks: the backoff before the next, and when to give up."""

    def __init__(self, give_up_after_s: float = GIVE_UP_AFTER_S):
        self.give_up_after_s = give_up_after_s
        self.since: float | None = None
        self.failures = 0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException, poll_s: float) -> float:
        """Record a failed look; the seconds to wait before the next one. Raises ServicesDown past the patience."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        self.failures += 1
        lasted = now - self.since
        if lasted >= self.give_up_after_s:
            raise ServicesDown(f"a service it needs has not answered for {lasted:.0f} s ({self.failures} tries; "
                               f"last: {_one_line(exc)}); exiting {exits.EXIT_SERVICES_DOWN} so the job restarts it") from exc
        wait = min(BACKOFF_MAX_S, poll_s * 2 ** min(self.failures, 10)) * random.uniform(0.5, 1.0)
        log.warning("transient failure %d (%.0f s into the outage; giving up at %.0f s): %s; next try in %.1f s", self.failures,
                    lasted, self.give_up_after_s, _one_line(exc), wait)
        return min(wait, max(0.0, self.give_up_after_s - lasted))

    def over(self) -> None:
        if self.since is not None:
            log.info("services answer again after %d failed look(s), %.0f s", self.failures, time.monotonic() - self.since)
        self.since, self.failures = None, 0


def _one_line(exc: BaseException) -> str:
    """The failure and, where a library wrapped it (Optuna's commit error), its cause: what went wrong underneath."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    cause = exc.__cause__
    return text if cause is None else f"{text} (caused by {type(cause).__name__}: {' '.join(str(cause).split())[:200]})"
