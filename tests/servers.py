"""Real servers on loopback for tests: started by the test, stopped by it, never anything beyond 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout} s: {last}")


@contextmanager
def process(cmd: list[str], health_url: str, timeout: float, log: Path):
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(health_url, timeout)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def moto_s3(tmp: Path, port: int | None = None):
    """moto's S3 server; yields its endpoint URL."""
    port = port or free_port()
    cmd = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    with process(cmd, f"http://127.0.0.1:{port}/moto-api/", 20, tmp / f"moto-{port}.log"):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def mlflow_server(tmp: Path, port: int | None = None):
    """A real MLflow tracking server backed by SQLite; yields its URI."""
    port = port or free_port()
    cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--default-artifact-root", str(tmp / "artifacts"), "--workers", "1"]
    with process(cmd, f"http://127.0.0.1:{port}/health", 90, tmp / f"mlflow-{port}.log"):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def prometheus(tmp: Path, targets: list[str], scrape_interval: str = "1s"):
    """Debian's prometheus scraping `targets` (host:port); yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        import pytest
        pytest.skip("the prometheus server is not installed (Debian package `prometheus`; .ci/run installs it)")
    port = free_port()
    config = tmp / "prometheus.yml"
    # honor_labels: the runtime's own `job` label (the training job) must win over the scrape job's name,
    # as it does on the cluster (PodMonitor honorLabels: true).
    config.write_text(f"global:\n  scrape_interval: {scrape_interval}\nscrape_configs:\n"
                      f"  - job_name: trainforge\n    honor_labels: true\n    static_configs:\n      - targets: {targets}\n")
    cmd = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
    with process(cmd, f"http://127.0.0.1:{port}/-/ready", 60, tmp / "prometheus.log"):
        yield f"http://127.0.0.1:{port}"
