"""A team's MLflow user, made (or its password set back to the platform's) as the MLflow admin.

Run in the cluster by the platform's per-team Job (platform/manifests/tracking.py) on the runtime image:
`python -m trainforge.trainer.tracking_users`, configured by its environment. Safe to run again: an existing user gets
its password reset to the one in the team's Secret, so the Secret stays the truth. Waits for the server first (the
Job may start while MLflow rolls out); every failure names what to check.

`python -m trainforge.trainer.tracking_users --probe` is `trainforge platform verify`'s check, run by a short Job of its
own: the tracking API as the admin, by the service's in-cluster name, the way every job reaches it.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from trainforge.contract import MLFLOW_USER_ENV as USER_ENV

CREATE = "/api/2.0/mlflow/users/create"
SEARCH = "/api/2.0/mlflow/experiments/search"
UPDATE_PASSWORD = "/api/2.0/mlflow/users/update-password"


class UserSetupError(RuntimeError):
    pass


def _call(uri: str, method: str, path: str, body: dict[str, Any], credentials: tuple[str, str]) -> tuple[int, str]:
    token = base64.b64encode(":".join(credentials).encode()).decode()
    request = urllib.request.Request(uri.rstrip("/") + path, data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_until_ready(uri: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError as e:
            last = str(e)
        time.sleep(2)
    raise UserSetupError(f"MLflow at {uri} did not answer /health within {timeout_s:.0f} s ({last}): is the mlflow "
                         "Deployment running?")


def ensure_user(uri: str, admin: tuple[str, str], username: str, password: str, *, ready_timeout_s: float = 600) -> str:
    """'created' or 'updated' (the user existed: its password is now `password`)."""
    wait_until_ready(uri, ready_timeout_s)
    status, text = _call(uri, "POST", CREATE, {"username": username, "password": password}, admin)
    if status == 200:
        return "created"
    if status == 400 and "RESOURCE_ALREADY_EXISTS" in text:
        status, text = _call(uri, "PATCH", UPDATE_PASSWORD, {"username": username, "password": password}, admin)
        if status == 200:
            return "updated"
    if status == 401:
        raise UserSetupError(f"MLflow refused the admin's credentials (401): the Secret {USER_ENV['admin_username']}/"
                             f"{USER_ENV['admin_password']} come from must be the one the chart was installed with")
    raise UserSetupError(f"MLflow answered {status} for user {username!r}: {text[:500]}")


def probe(uri: str, admin: tuple[str, str], *, ready_timeout_s: float = 30) -> str:
    """What the admin gets from the tracking API; UserSetupError naming the fix where it is refused."""
    wait_until_ready(uri, ready_timeout_s)
    status, text = _call(uri, "POST", SEARCH, {"max_results": 1}, admin)
    if status == 200:
        return f"MLflow at {uri} answers the admin"
    if status == 401:
        raise UserSetupError("MLflow refused the admin's credentials (401): the mlflow-admin Secret must hold the admin the "
                             "chart's auth config was installed with (`pulumi up` writes both)")
    if status == 403 and "Invalid Host header" in text:
        raise UserSetupError(f"MLflow refused the Host {uri.split('//', 1)[-1]} (403 Invalid Host header): the chart's "
                             "serverAllowedHosts must list the service's in-cluster names (platform/manifests/values.py mlflow_hosts)")
    raise UserSetupError(f"MLflow answered {status}: {text[:300]}. Fix: `kubectl -n mlflow logs deploy/mlflow` (the database "
                         "connection, the artifact bucket's role)")


def main() -> int:
    if sys.argv[1:] == ["--probe"]:
        return _probe_main()
    missing = [v for v in ("MLFLOW_TRACKING_URI", *USER_ENV.values()) if not os.environ.get(v)]
    if missing:
        print(f"tracking_users: {', '.join(missing)} not set (the Job sets them from the mlflow-admin and the team's "
              "Secrets)", file=sys.stderr)
        return 2
    env = os.environ
    try:
        done = ensure_user(env["MLFLOW_TRACKING_URI"], (env[USER_ENV["admin_username"]], env[USER_ENV["admin_password"]]),
                           env[USER_ENV["username"]], env[USER_ENV["password"]],
                           ready_timeout_s=float(env.get("MLFLOW_READY_TIMEOUT_S", "600")))
    except UserSetupError as e:
        print(f"tracking_users: {e}", file=sys.stderr)
        return 1
    print(f"MLflow user {env[USER_ENV['username']]}: {done}")
    return 0


def _probe_main() -> int:
    missing = [v for v in ("MLFLOW_TRACKING_URI", USER_ENV["admin_username"], USER_ENV["admin_password"]) if not os.environ.get(v)]
    if missing:
        print(f"tracking_users --probe: {', '.join(missing)} not set (the Job sets them from the mlflow-admin Secret)", file=sys.stderr)
        return 2
    env = os.environ
    try:
        print(probe(env["MLFLOW_TRACKING_URI"], (env[USER_ENV["admin_username"]], env[USER_ENV["admin_password"]]),
                    ready_timeout_s=float(env.get("MLFLOW_READY_TIMEOUT_S", "30"))))
    except UserSetupError as e:
        print(f"tracking_users --probe: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
