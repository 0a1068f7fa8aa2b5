"""The MLflow server's cost of an authenticated request: basic-auth's own check (scrypt on every request) against the
platform's (trainer/mlflow_auth.py `authenticate_request`: each password verified once per stored hash), side by side.

    python benchmarks/bench_mlflow_auth.py [--requests 50] [--quick]

For each credential check, a real `mlflow server --app-name trainforge-auth` on loopback (SQLite, one worker, the
check named in its auth ini as the chart's `auth.authorizationFunction` names it) answers `--requests` authenticated
`experiments/search` calls one after another, as the admin, after one warm-up call; the ratio is basic-auth's mean
time over the platform's, measured in the same run. MLflow runs its credential check several times per request (four
for this one; a team user's requests, which also pass the permission checks, run it at least as often), so the time
is mostly those checks. Each call of a training job's tracker, of `platform verify`'s probe, of a browser page is one
such request.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ADMIN = ("bench-admin", "bench-admin-password-0123456789")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_server(directory: Path, check: str) -> tuple[subprocess.Popen, str]:
    from trainforge import contract

    ini = configparser.ConfigParser()
    ini["mlflow"] = {"default_permission": "NO_PERMISSIONS", "database_uri": f"sqlite:///{directory}/auth.db",
                     "admin_username": ADMIN[0], "admin_password": ADMIN[1], "authorization_function": check}
    with open(directory / "basic_auth.ini", "w") as f:
        ini.write(f)
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(directory / "basic_auth.ini"),
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "bench-only", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    command = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
               "--backend-store-uri", f"sqlite:///{directory}/mlflow.db", "--workers", "1",
               "--default-artifact-root", str(directory / "artifacts"), "--app-name", contract.MLFLOW_AUTH_APP]
    with open(directory / "server.log", "w") as log:  # the child holds its own copy of the descriptor
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while not answers(f"{uri}/health"):  # readiness: the server's own health route answers
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"the MLflow server did not start; its log:\n{(directory / 'server.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return server, uri


def authenticated_call(uri: str) -> None:
    token = base64.b64encode(":".join(ADMIN).encode()).decode()
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, response.status


def mean_request_seconds(check: str, requests: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-auth-") as tmp:
        server, uri = start_server(Path(tmp), check)
        try:
            authenticated_call(uri)  # the first verification: paid once by either check
            started = time.perf_counter()
            for _ in range(requests):
                authenticated_call(uri)
            return (time.perf_counter() - started) / requests
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    from trainforge import contract

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 requests each: proves the script runs")
    args = parser.parse_args()
    requests = 5 if args.quick else args.requests
    console = Console()
    with console.status("starting MLflow servers and timing requests"):
        before = mean_request_seconds(contract.MLFLOW_BASIC_AUTH_FUNCTION, requests)
        after = mean_request_seconds(contract.MLFLOW_AUTH_FUNCTION, requests)
    table = Table(title=f"MLflow authenticated request, mean of {requests} (one server worker, this machine)",
                  title_justify="left")
    for column in ("credential check", "ms per request", "speed-up vs before"):
        table.add_column(column)
    table.add_row(f"before: {contract.MLFLOW_BASIC_AUTH_FUNCTION}", f"{before * 1000:.1f}", "1.0x")
    table.add_row(f"now: {contract.MLFLOW_AUTH_FUNCTION}", f"{after * 1000:.1f}", f"{before / after:.1f}x")
    console.print(table)


if __name__ == "__main__":
    main()
