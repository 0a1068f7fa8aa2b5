"""The budget controller against an OpenCost allocation API stand-in and the Kubernetes API stand-in, both on
loopback: under budget nothing changes, at the budget the queue is held (ConfigMap updated, Event written), a new month
or a raised budget releases it, and missing cost data never holds or releases anyone."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from support.repo import REPO
from support.kubeapi import serve
from support.cluster import queue, seeded, settings

from trainforge import contract
from trainforge.trainer.kube import Cluster
from trainforge.trainer.controllers.budget import BudgetController, CostUnavailable, PrometheusMetrics, decide, month_to_date, team_budget

NOV = dt.datetime(2026, 11, 22, 20, 0, tzinfo=dt.timezone.utc)
DEC = dt.datetime(2026, 12, 1, 0, 5, tzinfo=dt.timezone.utc)
VISION, LANGUAGE = contract.namespace_name("vision"), contract.namespace_name("language")


class OpenCost:
    """OpenCost's /allocation, aggregated by namespace and accumulated, as the real one answers (code + one set).

    `costs`: what each namespace spent in a window that is not a whole UTC day (the controller's "since the last
    settled day", or a test's own question); `daily`: what it spent on a whole day ("YYYY-MM-DD"), nothing if unset.
    `retention`: with `now`, Prometheus' retention — a window's part older than now - retention costs nothing."""

    def __init__(self):
        self.costs: dict[str, float] = {}
        self.daily: dict[str, dict[str, float]] = {}
        self.mode = "ok"  # ok | error | garbage
        self.queries: list[dict[str, str]] = []
        self.now: dt.datetime | None = None
        self.retention: dt.timedelta | None = None

    def spent(self, start: dt.datetime, end: dt.datetime) -> dict[str, float]:
        if end - start == dt.timedelta(days=1) and start.hour == 0:
            if self.retention is not None and self.now is not None and start < self.now - self.retention:
                return {}  # Prometheus no longer has that day
            return self.daily.get(start.strftime("%Y-%m-%d"), {})
        return self.costs

    def answer(self, query: dict[str, str]) -> tuple[int, str]:
        self.queries.append(query)
        if self.mode == "error":
            return 500, json.dumps({"code": 500, "message": "error querying prometheus: connection refused"})
        if self.mode == "garbage":
            return 200, json.dumps({"code": 200, "data": []})
        start, end = query["window"].split(",")
        parse = lambda t: dt.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)  # noqa: E731
        costs = self.spent(parse(start), parse(end))
        return 200, json.dumps({"code": 200, "data": [{ns: {"name": ns, "cpuCost": cost * 0.1, "gpuCost": cost * 0.8, "ramCost": cost * 0.1,
                                                            "totalCost": cost, "window": {"start": start, "end": end}}
                                                       for ns, cost in costs.items()}]})


@contextmanager
def opencost_server(state: OpenCost):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            url = urlparse(self.path)
            code, body = (state.answer({k: v[0] for k, v in parse_qs(url.query).items()}) if url.path == "/allocation"
                          else (404, "not found"))
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Both stand-ins, the controller as it runs in the cluster (a cluster-wide identity), and its metrics."""
    state = OpenCost()
    with serve(seeded()) as kube, opencost_server(state) as url:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig", "admin-token")))
        metrics = PrometheusMetrics()
        yield kube, state, BudgetController(Cluster(), url, metrics), metrics, url


def events(kube, namespace: str) -> list[dict]:
    return kube.api.of_kind("events", namespace)


def writes(kube) -> list[dict]:
    return [r for r in kube.api.requests if r["method"] in ("PATCH", "POST", "DELETE")]


def sample(metrics: PrometheusMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_under_budget_only_the_figures_are_written(world):
    kube, opencost, controller, metrics, _ = world
    opencost.costs = {VISION: 412.5, LANGUAGE: 1.25, "kube-system": 80.0}
    decisions = controller.run_once(NOV)
    assert {d.team: d.action for d in decisions} == {"vision": "none", "language": "none"}
    assert settings(kube)[contract.SETTING_SPENT_USD] == "412.50"
    assert settings(kube)[contract.SETTING_SPENT_MONTH] == "2026-11"
    assert settings(kube)[contract.SETTING_SPENT_AS_OF] == "2026-11-22T20:00:00Z"
    assert settings(kube, "language")[contract.SETTING_SPENT_USD] == "1.25"
    assert "stopPolicy" not in queue(kube)["spec"] and events(kube, VISION) == []
    # Each whole day of the month asked once (settled), then the rest of today.
    assert opencost.queries[0] == {"window": "2026-11-01T00:00:00Z,2026-11-02T00:00:00Z", "aggregate": "namespace", "accumulate": "true"}
    assert opencost.queries[-1]["window"] == "2026-11-22T00:00:00Z,2026-11-22T20:00:00Z" and len(opencost.queries) == 22
    assert sample(metrics, "trainforge_team_spent_usd", team="vision") == 412.5
    assert sample(metrics, "trainforge_team_budget_usd", team="vision") == 1500.0
    assert sample(metrics, "trainforge_team_budget_held", team="vision") == 0


def test_at_the_budget_the_queue_is_held_once_with_an_event(world):
    kube, opencost, controller, metrics, _ = world
    opencost.costs = {VISION: 1500.0, LANGUAGE: 10.0}
    controller.run_once(NOV)
    held = queue(kube)
    assert held["spec"]["stopPolicy"] == "Hold"
    assert "1,500.00 of $1,500.00 spent in 2026-11" in held["metadata"]["annotations"][contract.BUDGET_HOLD_ANNOTATION]
    assert "stopPolicy" not in queue(kube, "language")["spec"], "only the team at its budget"
    (event,) = events(kube, VISION)
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == ("BudgetReached", "Warning", contract.TEAM_SETTINGS_CONFIG_MAP)
    assert "ClusterQueue team-vision held" in event["message"]
    assert sample(metrics, "trainforge_team_budget_held", team="vision") == 1
    assert sample(metrics, "trainforge_budget_changes_total", team="vision", action="hold") == 1
    opencost.costs[VISION] = 1530.0  # still over: no second hold, no second event
    assert {d.team: d.action for d in controller.run_once(NOV + dt.timedelta(minutes=5))}["vision"] == "none"
    assert len(events(kube, VISION)) == 1 and settings(kube)[contract.SETTING_SPENT_USD] == "1530.00"


def test_a_new_month_releases_the_hold(world):
    kube, opencost, controller, metrics, _ = world
    opencost.costs = {VISION: 1600.0}
    controller.run_once(NOV)
    opencost.costs = {VISION: 3.2}  # December's first minutes
    decisions = {d.team: d for d in controller.run_once(DEC)}
    assert decisions["vision"].action == "release" and "a new month began (2026-12)" in decisions["vision"].reason
    released = queue(kube)
    assert released["spec"]["stopPolicy"] == "None" and contract.BUDGET_HOLD_ANNOTATION not in released["metadata"].get("annotations", {})
    assert [e["reason"] for e in events(kube, VISION)] == ["BudgetReached", "BudgetReleased"]
    assert opencost.queries[-1]["window"] == "2026-12-01T00:00:00Z,2026-12-01T00:05:00Z"
    assert sample(metrics, "trainforge_team_budget_held", team="vision") == 0


def test_a_raised_budget_releases_the_hold(world):
    kube, opencost, controller, _, _ = world
    opencost.costs = {VISION: 1600.0}
    controller.run_once(NOV)
    settings(kube)[contract.SETTING_BUDGET_USD] = "3000.00"  # what `pulumi up` writes after the stack's budget is raised
    decision = {d.team: d for d in controller.run_once(NOV + dt.timedelta(minutes=5))}["vision"]
    assert decision.action == "release" and "the budget was raised" in decision.reason
    assert queue(kube)["spec"]["stopPolicy"] == "None"


@pytest.mark.parametrize("outage", ["down", "error", "garbage"])
def test_no_cost_data_changes_nothing(world, outage, caplog):
    kube, opencost, controller, metrics, url = world
    opencost.costs = {VISION: 1600.0}
    controller.run_once(NOV)  # held in November
    before = len(writes(kube))
    if outage == "down":
        controller.opencost_url = "http://127.0.0.1:9"  # nothing listens there
    else:
        opencost.mode = outage
    with caplog.at_level(logging.WARNING, logger="trainforge.budget"), pytest.raises(CostUnavailable):
        controller.run_once(DEC)  # a new month, but no data to say the team is under budget
    assert len(writes(kube)) == before, "not a single write on missing data"
    assert queue(kube)["spec"]["stopPolicy"] == "Hold" and settings(kube)[contract.SETTING_SPENT_MONTH] == "2026-11"
    assert "no budget changes this pass" in caplog.text
    assert sample(metrics, "trainforge_budget_cost_unavailable_total") == 1


def test_a_hold_set_by_hand_is_never_lifted_by_the_controller(world):
    kube, opencost, controller, _, _ = world
    queue(kube)["spec"]["stopPolicy"] = "HoldAndDrain"  # a platform engineer stopped the queue
    opencost.costs = {VISION: 10.0}
    assert {d.team: d.action for d in controller.run_once(NOV)}["vision"] == "none"
    assert queue(kube)["spec"]["stopPolicy"] == "HoldAndDrain" and events(kube, VISION) == []


def test_the_decision_table():
    def team(held=False, ours=False, spent=None, month=None, budget=100.0):
        return team_budget("t", {contract.SETTING_BUDGET_USD: str(budget), **({contract.SETTING_SPENT_USD: str(spent)} if spent is not None else {}),
                                 **({contract.SETTING_SPENT_MONTH: month} if month else {})},
                           {"metadata": {"annotations": {contract.BUDGET_HOLD_ANNOTATION: "x"} if ours else {}},
                            "spec": {"stopPolicy": "Hold" if held else "None"}})
    assert decide(team(), 99.99, "2026-11").action == "none"
    assert decide(team(), 100.0, "2026-11").action == "hold"
    assert decide(team(held=True, ours=True, spent=120, month="2026-11"), 120.0, "2026-11").action == "none"
    assert decide(team(held=True, ours=True, spent=120, month="2026-10"), 5.0, "2026-11").reason.endswith("queued jobs may start")
    assert decide(team(held=True, ours=False), 5.0, "2026-11").action == "none"
    assert decide(team(held=True, ours=False), 500.0, "2026-11").action == "none", "already held: nothing to add"


def test_a_namespace_opencost_does_not_list_spent_nothing(world):
    _, opencost, _, _, url = world
    opencost.costs = {"kube-system": 3.0}
    assert month_to_date(url, NOV) == {"kube-system": 3.0}


def test_the_command_runs_one_pass_and_exits_1_without_data(world):
    kube, opencost, _, _, url = world
    opencost.costs = {VISION: 2000.0}
    env = {**os.environ, "KUBECONFIG": os.environ["KUBECONFIG"]}
    done = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "budget", "run", "--once", "--opencost", url],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "vision: hold" in done.stdout and queue(kube)["spec"]["stopPolicy"] == "Hold"
    blind = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "budget", "run", "--once", "--opencost", "http://127.0.0.1:9"],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert blind.returncode == 1 and "no budget changes this pass" in blind.stderr and "Traceback" not in blind.stderr


# ---- how the platform deploys it ---------------------------------------------------------------------------------

def platform_objects(evaluation) -> dict[tuple[str, str], dict]:
    from support.evaluated import kubernetes_objects, manifest
    return {(manifest(r)["kind"], manifest(r)["metadata"]["name"]): manifest(r) for r in kubernetes_objects(evaluation)}


def test_the_controller_may_only_hold_queues_update_team_settings_and_record_events(stack):
    evaluation, _ = stack
    role = platform_objects(evaluation)[("ClusterRole", contract.BUDGET_CONTROLLER)]
    grants = {(g, r, v, tuple(rule.get("resourceNames", ()))) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    assert grants == {("kueue.x-k8s.io", "clusterqueues", v, ()) for v in ("get", "list", "patch")} | \
        {("", "configmaps", v, (contract.TEAM_SETTINGS_CONFIG_MAP,)) for v in ("get", "patch")} | {("", "events", "create", ())}


def test_the_deployed_command_parses_and_its_metrics_are_scraped(stack):
    import typer

    from trainforge.trainer.cli import app
    evaluation, cfg = stack
    objects = platform_objects(evaluation)
    deployment = objects[("Deployment", contract.BUDGET_CONTROLLER)]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["command"][0] == "trainforge"
    group = typer.main.get_command(app)
    budget_group = group.get_command(None, container["command"][1])
    run = budget_group.get_command(None, container["command"][2])
    params = run.make_context("run", container["command"][3:]).params  # raises on an option the command lacks
    assert params["every"] == cfg.kubernetes.monitoring.budget_every_minutes * 60 and params["opencost"] == contract.OPENCOST_URL
    monitor = objects[("PodMonitor", contract.BUDGET_CONTROLLER)]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [deployment["metadata"]["namespace"]]
    port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
    assert [p["containerPort"] for p in container["ports"] if p["name"] == port] == [params["metrics_port"]]
    binding = objects[("ClusterRoleBinding", contract.BUDGET_CONTROLLER)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["spec"]["serviceAccountName"], "namespace": deployment["metadata"]["namespace"]}]


def test_opencost_reads_the_platforms_prometheus(stack):
    from support.evaluated import releases
    evaluation, _ = stack
    internal = releases(evaluation)["opencost"]["values"]["opencost"]["prometheus"]["internal"]
    assert f"http://{internal['serviceName']}.{internal['namespaceName']}.svc.cluster.local:{internal['port']}" == contract.PROMETHEUS_URL


def test_month_to_date_outlives_prometheus_retention_so_a_hold_lasts_the_month(world):
    """vision spends $100 a day for 15 days (held on the 16th), then $10 a day (its running jobs wind down); Prometheus
    keeps 15 days. Asked for the month so far, OpenCost would forget the first days and the spend would fall below the
    budget around the 20th — a release "because OpenCost revised it". The settled days keep it: held until December."""
    kube, opencost, controller, _, _ = world
    opencost.retention = dt.timedelta(days=15)
    actions = {}
    for day in range(1, 31):
        now = dt.datetime(2026, 11, day, 12, 0, tzinfo=dt.timezone.utc)
        opencost.now = now
        opencost.daily = {f"2026-11-{d:02d}": {VISION: 100.0 if d <= 15 else 10.0} for d in range(1, day)}
        opencost.costs = {VISION: 50.0 if day <= 15 else 5.0}  # today until noon
        (vision,) = [d for d in controller.run_once(now) if d.team == "vision"]
        actions[day] = (vision.action, vision.spent_usd)
    assert actions[15] == ("none", 1400.0 + 50.0)
    assert actions[16] == ("hold", 1500.0 + 5.0), "held when the month's spend reached $1,500"
    assert all(action == "none" for day, (action, _) in actions.items() if day > 16), actions
    assert actions[30][1] == 1500.0 + 14 * 10.0 + 5.0, "every settled day counted, though Prometheus lost the first half"
    assert queue(kube)["spec"]["stopPolicy"] == "Hold"
    days = json.loads(settings(kube)[contract.SETTING_SPENT_DAYS])
    assert len(days) == 29 and days["2026-11-01"] == 100.0
    asked = [q["window"] for q in opencost.queries if q["window"].startswith("2026-11-01T00:00:00Z,2026-11-02")]
    assert len(asked) == 1, "a settled day is never asked again"
    opencost.costs, opencost.daily = {VISION: 3.0}, {}
    (december,) = [d for d in controller.run_once(DEC) if d.team == "vision"]
    assert december.action == "release" and "a new month began (2026-12)" in december.reason


def test_a_damaged_record_of_settled_days_is_asked_again(world):
    kube, opencost, controller, _, _ = world
    opencost.daily = {"2026-11-01": {VISION: 7.0}}
    settings(kube).update({contract.SETTING_SPENT_MONTH: "2026-11", contract.SETTING_SPENT_DAYS: "not json"})
    (vision,) = [d for d in controller.run_once(dt.datetime(2026, 11, 2, 3, 0, tzinfo=dt.timezone.utc)) if d.team == "vision"]
    assert vision.spent_usd == 7.0 and json.loads(settings(kube)[contract.SETTING_SPENT_DAYS]) == {"2026-11-01": 7.0}


@pytest.mark.parametrize("zone", ["America/Los_Angeles", "Pacific/Kiritimati", "UTC"])
def test_a_laptop_and_the_cluster_count_the_same_month_in_any_time_zone(monkeypatch, zone):
    """Issue 23: the local ledger began the month at local midnight, the budget controller at UTC midnight, so near a
    month's end `check` on a laptop and the cluster disagreed. One month, the UTC one, for both."""
    import datetime as dt
    import time
    from types import SimpleNamespace

    from trainforge.trainer import ledger
    from trainforge.trainer.controllers import budget
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        now = dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.timezone.utc)  # 30 November still, in Los Angeles
        assert ledger.month_start(now) == budget.month_start(now).timestamp() == dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc).timestamp()
        late_november = dt.datetime(2026, 11, 30, 23, 30, tzinfo=dt.timezone.utc).timestamp()
        job = SimpleNamespace(name="j", team="vision", nodes=1, run_seconds=3600.0, started_at=late_november, created_at=late_november,
                              instance_type="g6.xlarge", capacity="on-demand", region="us-west-2")
        assert ledger.spent_this_month("vision", [job], now) == 0.0, "November's job is not December's spend"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
