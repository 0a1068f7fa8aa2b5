"""Real servers on loopback for tests: started by the test, stopped by it, never anything beyond 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import os
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from support.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    last: list[Exception] = []

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except Exception as exc:  # noqa: BLE001 - not up yet
            last[:] = [exc]
            return False
    try:
        wait_until(answers, timeout, what=f"{url} to answer")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc} (last: {last[-1] if last else None})") from None


@contextmanager
def process(cmd: list[str], health_url: str, timeout: float, log: Path, env: dict[str, str] | None = None):
    """A server process, yielded once `health_url` answers; stopped after."""
    with process_starting(cmd, health_url, timeout, log, env) as ready:
        yield ready()


@contextmanager
def process_starting(cmd: list[str], health_url: str, timeout: float, log: Path, env: dict[str, str] | None = None):
    """The same process, yielded while it starts: `ready()` waits until `health_url` answers and returns the process,
    so the caller can do other work meanwhile."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env} if env else None)
    answered: list[subprocess.Popen] = []

    def ready() -> subprocess.Popen:
        if not answered:
            wait_http(health_url, timeout)
            answered.append(proc)
        return proc
    try:
        yield ready
    finally:
        stop(proc, 10)


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `grace_s`."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextmanager
def moto_server(tmp: Path, port: int | None = None):
    """moto's server (one endpoint for S3, EC2 and the other services it implements); yields its URL."""
    port = port or free_port()
    cmd = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    with process(cmd, f"http://127.0.0.1:{port}/moto-api/", 20, tmp / f"moto-{port}.log"):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def mlflow_server(tmp: Path, port: int | None = None, env: dict[str, str] | None = None, app_name: str | None = None,
                  proxied_artifacts: bool = False):
    """A real MLflow tracking server backed by SQLite (`env`: settings as the chart passes them; `app_name`: its
    `--app-name`, e.g. trainforge-auth; `proxied_artifacts`: artifacts served by the server from a destination only it
    reads, `mlflow-artifacts:/` URIs, as the chart runs it); yields its URI once it answers."""
    with mlflow_server_starting(tmp, port, env, app_name, proxied_artifacts) as ready:
        yield ready()


@contextmanager
def mlflow_server_starting(tmp: Path, port: int | None = None, env: dict[str, str] | None = None, app_name: str | None = None,
                           proxied_artifacts: bool = False):
    """The same server, yielded while it starts (it takes 10-15 s, mostly imports): `ready()` waits until it answers
    and returns its URI, so the caller can do other work meanwhile."""
    port = port or free_port()
    cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--workers", "1",
           *(["--artifacts-destination", str(tmp / "artifacts"), "--serve-artifacts"] if proxied_artifacts else
             ["--default-artifact-root", str(tmp / "artifacts")]),
           *(["--app-name", app_name] if app_name else [])]
    uri = f"http://127.0.0.1:{port}"
    # No job runner (seven more MLflow processes) unless the caller's env asks for one: the chart turns it off where
    # server-side jobs and scorers are (platform/manifests/tracking.server_env).
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    with process_starting(cmd, f"{uri}/health", 90, tmp / f"mlflow-{port}.log", env) as started:
        def ready() -> str:
            started()
            return uri
        yield ready


def chart_auth_ini(mlflow_objects: list[dict], admin: tuple[str, str], directory: Path) -> tuple[dict[str, str], Path]:
    """The MLflow chart's auth ini (its `auth_template.ini` ConfigMap) with the admin's placeholders filled as the
    chart's init container fills them; returns its [mlflow] section as rendered and the file written to `directory`
    for a test server (MLFLOW_AUTH_CONFIG_PATH), whose one change is the users' database: SQLite in `directory`."""
    import configparser

    (template,) = [o["data"]["auth_template.ini"] for o in mlflow_objects
                   if o["kind"] == "ConfigMap" and "auth_template.ini" in (o.get("data") or {})]
    ini = configparser.ConfigParser()
    ini.read_string(template.replace("$(ADMIN_USERNAME_PLACEHOLDER)", admin[0]).replace("$(ADMIN_PASSWORD_PLACEHOLDER)", admin[1]))
    rendered = dict(ini["mlflow"])
    ini["mlflow"]["database_uri"] = f"sqlite:///{directory}/auth.db"
    path = directory / "basic_auth.ini"
    with open(path, "w") as f:
        ini.write(f)
    return rendered, path


def scrape_config(pod_monitor: dict, targets: list[str], target_labels: dict[str, str]) -> dict:
    """The scrape job the Prometheus operator makes of a PodMonitor's (or ServiceMonitor's) first endpoint, for static `targets` that carry
    `target_labels` (on the cluster: namespace, pod, container and `job` = <namespace>/<monitor name>, from discovery)."""
    spec = pod_monitor["spec"]
    endpoint = (spec.get("podMetricsEndpoints") or spec["endpoints"])[0]  # a PodMonitor's, or a ServiceMonitor's
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex", "replacement": "replacement"}
    limits = {"sampleLimit": "sample_limit", "labelLimit": "label_limit", "labelNameLengthLimit": "label_name_length_limit",
              "labelValueLengthLimit": "label_value_length_limit"}
    return {"job_name": "trainforge", "honor_labels": bool(endpoint.get("honorLabels", False)),
            "static_configs": [{"targets": targets, "labels": target_labels}],
            "metric_relabel_configs": [{keys.get(k, k) if k != "action" else "action": (v.lower() if k == "action" else v)
                                        for k, v in rule.items()} for rule in endpoint.get("metricRelabelings", [])],
            **{limits[k]: v for k, v in spec.items() if k in limits}}


def trainer_scrape(targets: list[str], namespace: str = "team-vision") -> dict:
    """The program's own trainer PodMonitor as Prometheus runs it, over `targets` in `namespace`."""
    from trainforge import contract
    from trainforge.platform.manifests import monitoring
    monitor = monitoring.trainer_pod_monitor()
    return scrape_config(monitor, targets, {"namespace": namespace, "pod": "trainer-0",
                                            "job": f"{contract.NAMESPACE_MONITORING}/{monitoring.TRAINER_PODMONITOR}"})


@contextmanager
def prometheus(tmp: Path, targets: list[str], scrape_interval: str = "1s", job: dict | None = None):
    """Debian's prometheus scraping `targets` (host:port) as the cluster does (the program's trainer PodMonitor), or
    with the scrape `job` given; yields its base URL."""
    import json
    binary = shutil.which("prometheus")
    if binary is None:
        import pytest
        pytest.skip("the prometheus server is not installed (Debian package `prometheus`; .ci/run installs it)")
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": scrape_interval},  # JSON is YAML
                                  "scrape_configs": [job or trainer_scrape(targets)]}))
    cmd = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
    with process(cmd, f"http://127.0.0.1:{port}/-/ready", 60, tmp / "prometheus.log"):
        yield f"http://127.0.0.1:{port}"


class PricingAPI:
    """The AWS Price List Query API (JSON 1.1, `AWSPriceListService.GetProducts`) on loopback.

    moto does not implement this service, so this serves the documents it is given (the real price list's
    shape), filtered by TERM_MATCH on product attributes exactly as the service does, one product per page so
    callers must follow NextToken. `requests` keeps what clients sent.
    """

    def __init__(self, products: list[dict]):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.products = products
        self.requests: list[dict] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.headers.get("X-Amz-Target") != "AWSPriceListService.GetProducts":
                    return self._send(400, {"__type": "InvalidParameterException", "message": "unsupported operation"})
                api.requests.append(body)
                matches = [p for p in api.products if body.get("ServiceCode") == p["serviceCode"] and all(
                    p["product"]["attributes"].get(f["Field"]) == f["Value"] for f in body.get("Filters", []))]
                start = int(body.get("NextToken") or 0)
                page = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in matches[start:start + 1]]}
                if start + 1 < len(matches):
                    page["NextToken"] = str(start + 1)
                self._send(200, page)

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()


def ec2_product(instance_type: str, region: str, usd_per_hour: float, **attributes) -> dict:
    """One price list document in the shape AWS publishes for an EC2 on-demand instance-hour."""
    sku = f"SKU{abs(hash((instance_type, region, tuple(attributes.items())))) % 10**10:010d}"
    attrs = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
             "preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required", "servicecode": "AmazonEC2",
             **attributes}
    dimension = f"{sku}.JRTCKXETXF.6YS6EN2CT7"
    return {
        "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {dimension: {"unit": "Hrs", "endRange": "Inf", "beginRange": "0", "rateCode": dimension, "appliesTo": [],
                                            "description": f"${usd_per_hour} per On Demand Linux {instance_type} Instance Hour",
                                            "pricePerUnit": {"USD": f"{usd_per_hour:.10f}"}}},
            "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF", "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z",
    }


def postgres_binaries() -> Path | None:
    """The directory of Debian's PostgreSQL server programs (they are not on PATH: /usr/lib/postgresql/<major>/bin)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return versions[-1].parent if versions else None


@contextmanager
def postgres_server(tmp: Path, superuser_password: str = "superuser"):
    """A real PostgreSQL on 127.0.0.1 (password authentication over TCP, as RDS), run as the `postgres` system user
    when the tests run as root (the server refuses root). Yields (port, superuser, password); ready when the superuser
    can connect."""
    import psycopg2

    import tempfile

    binaries = postgres_binaries()
    # Its own directory outside pytest's (root's 0700 tree, which the `postgres` user cannot enter), removed after.
    home = Path(tempfile.mkdtemp(prefix="trainforge-pg-"))
    data, sockets, password_file = home / "data", home / "sockets", home / "superuser.password"
    sockets.mkdir()
    password_file.write_text(superuser_password + "\n")
    run_as: list[str] = []
    if os.geteuid() == 0:
        run_as = ["runuser", "-u", "postgres", "--"]
        for path in (home, sockets, password_file):
            shutil.chown(path, "postgres")
    made = subprocess.run([*run_as, str(binaries / "initdb"), "-D", str(data), "-U", "superuser", "--pwfile", str(password_file),
                           "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--no-instructions"],
                          capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {made.stderr[-2000:]}")
    port = free_port()
    log = open(tmp / "postgres.log", "w")
    proc = subprocess.Popen([*run_as, str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets),
                             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def accepts_connections() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(tmp / 'postgres.log').read_text()[-2000:]}")
            try:
                psycopg2.connect(host="127.0.0.1", port=port, user="superuser", password=superuser_password, dbname="postgres").close()
                return True
            except psycopg2.OperationalError:  # not accepting connections yet
                return False
        wait_until(accepts_connections, 60, interval=0.1, what="postgres to accept connections")
        yield port, "superuser", superuser_password
    finally:
        stop(proc, 20)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


class Outage:
    """A TCP endpoint on loopback that is down (nothing listens: connection refused, as when a server's pod is gone)
    until `restore()`, then forwards every connection to `target` (host:port); `cut()` takes it down again, dropping
    the connections it carries (a database's failover). For tests of clients that must ride out an outage of a real
    server without waiting for that server's own start-up."""

    def __init__(self, target: str):
        import threading

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._target = target.rsplit(":", 1)[0].split("//")[-1], int(target.rsplit(":", 1)[1])
        self._listener: socket.socket | None = None
        self._closed = threading.Event()
        self._carried: list[socket.socket] = []

    def restore(self) -> None:
        import threading

        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for s in self._carried:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._carried.clear()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._carried += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.close()
