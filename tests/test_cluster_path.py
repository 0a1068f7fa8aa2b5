"""The submitter's cluster path, through the official `kubernetes` client, against a Kubernetes API on loopback
(tests/support/kubeapi.py) holding what the dev stack's `pulumi up` creates — the program's objects and its charts' renders —
and authorising every request with RBAC over the program's own Roles and bindings, for a team member's identity: the
groups the program's EKS access entry maps their IAM role to.

The CLI runs as a subprocess with a KUBECONFIG pointing at the stand-in, so exit codes and messages are the user's.
The tests play Kueue and the Trainer: they set the job's conditions the way those controllers would."""

from __future__ import annotations

import datetime
import json
import subprocess
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from support.cli import run_cli
from support.repo import REPO
from support.kubeapi import serve

from trainforge import contract, k8s_schema
from support.cluster import LANGUAGE, STACK, VISION, queue, raw_request, seeded, settings

THIS_MONTH = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m")


@pytest.fixture
def cluster(tmp_path):
    with serve(seeded()) as served:
        served.config = served.kubeconfig(tmp_path / "kubeconfig", "vision-token")
        yield served


def cli(served, *argv: str, kubeconfig=None, home=None) -> subprocess.CompletedProcess:
    return run_cli(*argv, home=home or served.config.parent / "home", env={"KUBECONFIG": str(kubeconfig or served.config)}, timeout=120)


def submit(served, kind: str = "trainjob", spec: str = "examples/quickstart.yaml", *extra: str) -> subprocess.CompletedProcess:
    return cli(served, "submit", spec, "--backend", "kubernetes", "--kind", kind, "--stack", str(STACK), *extra)


def job(served, kind: str, name: str = "quickstart") -> dict | None:
    group, version, plural = {"trainjob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
                              "pytorchjob": ("kubeflow.org", "v1", "pytorchjobs")}[kind]
    return served.api.find(group, version, plural, VISION, name)


def set_conditions(served, kind: str, conditions: dict[str, str], **status) -> None:
    obj = job(served, kind)
    obj["status"] = {"conditions": [{"type": t, "status": s, "reason": t, "message": "", "lastTransitionTime": "2026-11-22T00:00:00Z"}
                                    for t, s in conditions.items()], **status}


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_submit_creates_the_job_in_the_team_namespace_with_its_queue_and_priority(cluster, kind):
    result = submit(cluster, kind)
    assert result.returncode == 0, result.stderr
    created = job(cluster, kind)
    assert created is not None, "the job is in the team's namespace"
    labels = created["metadata"]["labels"]
    assert labels[contract.KUEUE_QUEUE_LABEL] == contract.queue_name("vision")
    assert labels[contract.KUEUE_PRIORITY_LABEL] == contract.priority_class_name("normal")
    assert k8s_schema.problems(created) == [], "what reached the API server validates against the pinned CRD"
    assert f"created {created['kind']} {VISION}/quickstart" in result.stdout


def test_a_job_that_names_no_image_runs_the_one_the_platform_deployed(cluster):
    """The program's image is tagged by content, so no client can name it from its own version: the team's settings
    carry the deployed image by digest, and a job without an `image` runs exactly that."""
    from support.evaluated import evaluation_of
    (image,) = evaluation_of(STACK).of_type("docker-build:index:Image")
    assert settings(cluster)[contract.SETTING_DEFAULT_IMAGE] == image.state["ref"]
    assert submit(cluster).returncode == 0
    assert job(cluster, "trainjob")["spec"]["trainer"]["image"] == image.state["ref"]


def test_status_follows_the_job_from_queued_to_running_to_succeeded(cluster):
    assert submit(cluster).returncode == 0
    seen = []
    for conditions, extra in [({}, {}), ({"Suspended": "True"}, {}),
                              ({"Suspended": "False"}, {"jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0}]}),
                              ({"Suspended": "False", "Complete": "True"}, {})]:
        set_conditions(cluster, "trainjob", conditions, **extra)
        result = cli(cluster, "status", "quickstart", "--backend", "kubernetes", "--team", "vision")
        assert result.returncode == 0, result.stderr
        seen.append(result.stdout.split(":")[1].split()[0])
    assert seen == ["created", "queued", "running", "succeeded"]


def test_a_failed_pytorchjob_reads_failed_and_json_carries_its_status(cluster):
    assert submit(cluster, "pytorchjob").returncode == 0
    set_conditions(cluster, "pytorchjob", {"Created": "True", "Running": "False", "Failed": "True"})
    result = cli(cluster, "status", "quickstart", "--backend", "kubernetes", "--team", "vision", "--kind", "pytorchjob", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert {c["type"] for c in json.loads(result.stdout)["conditions"]} == {"Created", "Running", "Failed"}
    listed = cli(cluster, "list", "--backend", "kubernetes", "--team", "vision", "--kind", "pytorchjob", "-o", "json")
    assert [(r["name"], r["state"]) for r in json.loads(listed.stdout)] == [("quickstart", "failed")]


def test_logs_come_from_the_jobs_pods_only(cluster):
    assert submit(cluster).returncode == 0
    for name, owner in (("quickstart-node-0-0", "quickstart"), ("quickstart-node-0-1", "quickstart"), ("other-node-0-0", "other")):
        cluster.api.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": VISION,
                                                                          "labels": {"jobset.sigs.k8s.io/jobset-name": owner}}})
        cluster.api.pod_logs[(VISION, name)] = f"step 10 loss 2.5 from {name}\n"
    result = cli(cluster, "logs", "quickstart", "--backend", "kubernetes", "--team", "vision")
    assert result.returncode == 0, result.stderr
    assert "from quickstart-node-0-0" in result.stdout and "from quickstart-node-0-1" in result.stdout
    assert "other-node" not in result.stdout


def test_cancel_deletes_in_the_foreground_so_pods_get_their_grace_period(cluster):
    assert submit(cluster).returncode == 0
    result = cli(cluster, "cancel", "quickstart", "--backend", "kubernetes", "--team", "vision")
    assert result.returncode == 0, result.stderr
    (delete,) = [r for r in cluster.api.requests if r["method"] == "DELETE"]
    # DeleteOptions may travel as the body or as query parameters; the API server reads either.
    policy = (delete["body"] or {}).get("propagationPolicy") or parse_qs(urlparse(delete["path"]).query).get("propagationPolicy", [None])[0]
    assert policy == "Foreground"
    assert job(cluster, "trainjob") is None
    again = cli(cluster, "cancel", "quickstart", "--backend", "kubernetes", "--team", "vision")
    assert again.returncode == 2 and "no job named 'quickstart'" in again.stderr


def test_the_live_cluster_queue_quota_wins_over_the_stack(cluster):
    for flavor in queue(cluster)["spec"]["resourceGroups"][0]["flavors"]:
        for resource in flavor["resources"]:
            if resource["name"] == contract.RESOURCE_GPU and flavor["name"] == "gpu-spot":
                resource["nominalQuota"] = 1  # the stack says 4; someone lowered it on the cluster
    result = submit(cluster)
    assert result.returncode == 3
    assert "Kueue can never admit this job into the cluster's ClusterQueue team-vision" in result.stderr
    assert "insufficient quota for nvidia.com/gpu in flavor gpu-spot, request > maximum capacity (2 > 1)" in result.stderr
    assert job(cluster, "trainjob") is None


def test_the_budget_comes_from_the_teams_config_map(cluster):
    data = settings(cluster)
    data.update({contract.SETTING_SPENT_USD: "1499.90", contract.SETTING_SPENT_MONTH: THIS_MONTH,
                 contract.SETTING_SPENT_AS_OF: f"{THIS_MONTH}-01T06:00:00Z"})
    refused = cli(cluster, "check", "examples/quickstart.yaml", "--backend", "kubernetes", "--stack", str(STACK))
    assert refused.returncode == 3 and "team 'vision' has $0.10 left of $1,500.00 this month" in refused.stderr
    assert submit(cluster).returncode == 3 and job(cluster, "trainjob") is None
    shown = cli(cluster, "cost", "--team", "vision", "--backend", "kubernetes", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    expected = {"budget_usd": 1500.0, "spent_usd": 1499.9, "left_usd": 0.1, "month": THIS_MONTH, "held_for_budget": False}
    assert {k: v for k, v in json.loads(shown.stdout).items() if k in expected} == expected
    table = cli(cluster, "cost", "--team", "vision", "--backend", "kubernetes")
    assert "$1,499.90" in table.stdout and "open" in table.stdout
    data[contract.SETTING_SPENT_MONTH] = "2020-01"  # last recorded in an earlier month: nothing spent in this one yet
    assert cli(cluster, "check", "examples/quickstart.yaml", "--backend", "kubernetes", "--stack", str(STACK)).returncode == 0


def test_a_queue_held_for_budget_makes_submit_say_the_team_is_over_budget(cluster):
    held = queue(cluster)
    held["spec"]["stopPolicy"] = "Hold"
    held["metadata"]["annotations"] = {contract.BUDGET_HOLD_ANNOTATION: "$1,512.40 of $1,500.00 spent in 2026-11"}
    result = submit(cluster)
    assert result.returncode == 3 and "nothing was created" in result.stderr
    assert "team 'vision' is over its monthly budget ($1,512.40 of $1,500.00 spent in 2026-11)" in result.stderr
    assert job(cluster, "trainjob") is None
    held["metadata"]["annotations"] = {}  # held by hand: not a budget matter
    stopped = submit(cluster)
    assert stopped.returncode == 3 and "the platform team has stopped ClusterQueue team-vision" in stopped.stderr


def test_api_down_says_so_and_exits_1(cluster):
    cluster.stop()
    result = submit(cluster)
    assert result.returncode == 1, result.stderr
    assert "cannot be reached" in result.stderr and "Traceback" not in result.stderr


def test_rejected_credentials_exit_2_with_the_fix(cluster, tmp_path):
    result = cli(cluster, "status", "quickstart", "--backend", "kubernetes", "--team", "vision",
                 kubeconfig=cluster.kubeconfig(tmp_path / "stale", "expired-token"))
    assert result.returncode == 2 and "401 Unauthorized" in result.stderr and "aws eks update-kubeconfig" in result.stderr


def test_another_teams_namespace_is_forbidden_with_the_fix(cluster):
    result = cli(cluster, "list", "--backend", "kubernetes", "--team", "language")
    assert result.returncode == 2 and "forbidden (403)" in result.stderr and f"namespace {LANGUAGE}" in result.stderr
    assert "role ARN" in result.stderr


def test_missing_things_are_404s_that_say_what_is_missing(cluster):
    missing = cli(cluster, "status", "no-such-job", "--backend", "kubernetes", "--team", "vision")
    assert missing.returncode == 2 and "no job named 'no-such-job' (TrainJob) in namespace team-vision" in missing.stderr
    cluster.api.unserved.add("trainjobs")  # the Trainer is not installed
    unserved = cli(cluster, "list", "--backend", "kubernetes", "--team", "vision")
    assert unserved.returncode == 2 and "does not serve that API" in unserved.stderr


def test_a_team_without_a_namespace_is_named(cluster, tmp_path):
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    admin = cluster.kubeconfig(tmp_path / "admin", "admin-token")
    cluster.api.namespaces.discard(VISION)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = cli(cluster, "cost", "--team", "vision", "--backend", "kubernetes", kubeconfig=admin)
    assert result.returncode == 2 and "has no trainforge-team ConfigMap in namespace team-vision" in result.stderr


# ---- what a member may and may not do, under the program's own RBAC -------------------------------------------------


FORBIDDEN = {
    "read Secrets": ("GET", f"/api/v1/namespaces/{VISION}/secrets", None),
    "read another Secret by name": ("GET", f"/api/v1/namespaces/{VISION}/secrets/mlflow-db", None),
    "rewrite its budget state": ("PATCH", f"/api/v1/namespaces/{VISION}/configmaps/{contract.TEAM_SETTINGS_CONFIG_MAP}",
                                 {"data": {contract.SETTING_SPENT_USD: "0"}}),
    "change its namespace quota": ("PATCH", f"/api/v1/namespaces/{VISION}/resourcequotas/trainforge-quota",
                                   {"spec": {"hard": {"requests.nvidia.com/gpu": "1000"}}}),
    "change its Kueue quota": ("PATCH", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{contract.cluster_queue_name('vision')}",
                               {"spec": {"resourceGroups": []}}),
    "clear a hold": ("PATCH", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{contract.cluster_queue_name('vision')}",
                     {"spec": {"stopPolicy": "None"}}),
    "read every team's queue": ("GET", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues", None),
    "create a pod (bypassing Kueue)": ("POST", f"/api/v1/namespaces/{VISION}/pods", {"metadata": {"name": "p"}}),
    "create a Job (bypassing Kueue)": ("POST", f"/apis/batch/v1/namespaces/{VISION}/jobs", {"metadata": {"name": "j"}}),
    "point its LocalQueue elsewhere": ("PATCH", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{VISION}/localqueues/{contract.queue_name('vision')}",
                                       {"spec": {"clusterQueue": contract.cluster_queue_name("language")}}),
    "drop its network policy": ("DELETE", f"/apis/networking.k8s.io/v1/namespaces/{VISION}/networkpolicies/default-deny", None),
    "relax Pod Security": ("PATCH", f"/api/v1/namespaces/{VISION}", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
    "change its defaults": ("PATCH", f"/api/v1/namespaces/{VISION}/limitranges/trainforge-defaults", {"spec": {"limits": []}}),
    "bind itself a role": ("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{VISION}/rolebindings", {"metadata": {"name": "b"}}),
    "widen its role": ("PATCH", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{VISION}/roles/trainforge-team-member", {"rules": []}),
    "bind itself cluster-wide": ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {"metadata": {"name": "b"}}),
    "annotate its service account's role": ("PATCH", f"/api/v1/namespaces/{VISION}/serviceaccounts/{contract.TRAINING_SERVICE_ACCOUNT}",
                                            {"metadata": {"annotations": {contract.IRSA_ROLE_ANNOTATION: "arn:aws:iam::1:role/x"}}}),
    "list another team's jobs": ("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{LANGUAGE}/trainjobs", None),
    "submit into another team": ("POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{LANGUAGE}/trainjobs",
                                 {"metadata": {"name": "x", "labels": {contract.KUEUE_QUEUE_LABEL: contract.queue_name("language")}}}),
    "read another team's settings": ("GET", f"/api/v1/namespaces/{LANGUAGE}/configmaps/{contract.TEAM_SETTINGS_CONFIG_MAP}", None),
    "read another team's queue": ("GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{contract.cluster_queue_name('language')}", None),
    "read another team's sweep database": ("GET", f"/api/v1/namespaces/{LANGUAGE}/secrets/{contract.SWEEP_STORAGE_SECRET}", None),
}


@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_a_member_cannot(cluster, what):
    method, path, body = FORBIDDEN[what]
    assert raw_request(cluster, "vision-token", method, path, body) == 403, f"a vision member could {what}"
    # The same request from an administrator is not refused for lack of rights: the rule, not the stand-in, says no.
    assert raw_request(cluster, "admin-token", method, path, body) != 403


def readme_cluster_commands() -> list[str]:
    """The commands of the README's cluster section, one per line, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- cluster-commands -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines() if line.strip().startswith("trainforge ")]


def test_every_cluster_command_of_the_readme_runs_as_a_team_member(cluster):
    """alice of vision, through the program's access entry groups and RBAC: check, submit, status, list, logs, cost,
    cancel succeed (sweeps: test_sweep's cluster sweep runs as the same member)."""
    commands = readme_cluster_commands()
    assert {c.split()[1] for c in commands} >= {"check", "submit", "status", "list", "logs", "cost", "cancel", "sweep"}
    ran = []
    for command in commands:
        if command.split()[1] == "sweep":
            continue
        for placeholder, value in {"job.yaml": "examples/quickstart.yaml", "NAME": "quickstart", "TEAM": "vision", "<env>": "dev"}.items():
            command = command.replace(placeholder, value)
        argv = command.split()[1:]
        result = cli(cluster, *argv)
        assert result.returncode == 0, (command, result.stderr)
        ran.append(argv[0])
    assert ran[-1] == "cancel" and job(cluster, "trainjob") is None
    assert not [r for r in cluster.api.requests if r["method"] != "GET" and "/trainjobs" not in r["path"]], "only the job was written"


def test_a_member_reads_its_teams_sweep_database_and_no_other(cluster, monkeypatch):
    from trainforge.trainer.kube import Cluster, ClusterError
    secret = cluster.api.find("", "v1", "secrets", VISION, contract.SWEEP_STORAGE_SECRET)
    assert secret is not None, "the program creates the team's sweep Secret"
    monkeypatch.setenv("KUBECONFIG", str(cluster.config))
    member_cluster = Cluster()
    stored = member_cluster.sweep_storage("vision")
    assert stored is not None and stored.startswith("postgresql")
    with pytest.raises(ClusterError) as refused:
        member_cluster.sweep_storage("language")
    assert "forbidden (403)" in str(refused.value)


@pytest.mark.parametrize("labels", [{}, {contract.KUEUE_QUEUE_LABEL: contract.queue_name("language")},
                                    {contract.KUEUE_QUEUE_LABEL: contract.queue_name("vision"), contract.KUEUE_PRIORITY_LABEL: "urgent"}],
                         ids=["no queue", "another team's queue", "a priority the platform lacks"])
def test_a_member_cannot_go_round_its_queue(cluster, labels):
    """RBAC lets a member create TrainJobs; the program's admission policy decides what they may say."""
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "sneaky", "labels": labels}}
    assert raw_request(cluster, "vision-token", "POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{VISION}/trainjobs", body) == 403
    assert cluster.api.find("trainer.kubeflow.org", "v1alpha1", "trainjobs", VISION, "sneaky") is None
