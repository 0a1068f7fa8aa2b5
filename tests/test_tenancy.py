"""Teams as tenants, under the mock engine for every stack: each team has every object, its quotas equal the config,
every object is valid and cost-labelled, and isolation holds when the generated documents are evaluated (IAM for S3,
RBAC across namespaces, NetworkPolicy ingress) — not merely because the objects exist."""

from __future__ import annotations

import copy
import fnmatch
import json
import re

import pytest
from support.repo import REPO
from support.evaluated import manifest

from trainforge import contract, k8s_schema
from trainforge.contract import Flavour
from trainforge.platform.manifests import storage
from trainforge.stackconfig import CONFIG_KEY, ConfigError, parse, read_stack_file

KINDS = {"Namespace", "ResourceQuota", "LimitRange", "ClusterQueue", "LocalQueue", "Role", "RoleBinding", "NetworkPolicy",
         "ServiceAccount", "ConfigMap", "PersistentVolumeClaim", "Secret", "Job"}  # the last two: the team's sweep database
CORE = KINDS - {"ClusterQueue", "LocalQueue"}
TEAM_LABEL = f"{contract.LABEL_DOMAIN}/{contract.TAG_TEAM}"


def team_objects(evaluation, team: str) -> list[dict]:
    out = []
    for r in evaluation.resources:
        if r.type.startswith("kubernetes:") and "helm.sh" not in r.type:
            obj = manifest(r)
            if (obj.get("metadata") or {}).get("labels", {}).get(TEAM_LABEL) == team and obj["kind"] in KINDS:
                out.append(obj)
    return out


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def test_every_team_has_every_object_valid_and_cost_labelled(stack):
    import kubernetes_validate
    evaluation, cfg = stack
    for team in cfg.teams:
        objects = team_objects(evaluation, team.name)
        assert {o["kind"] for o in objects} == KINDS, team.name
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert labels[f"{contract.LABEL_DOMAIN}/{contract.TAG_COST_CENTRE}"] and labels[f"{contract.LABEL_DOMAIN}/{contract.TAG_ENVIRONMENT}"] == cfg.environment
            if obj["kind"] in CORE:
                kubernetes_validate.validate(obj, f"{cfg.cluster.version}.0", strict=True)
            else:
                assert k8s_schema.problems(obj) == [], obj["kind"]
            if obj["metadata"].get("namespace") == contract.NAMESPACE_MLFLOW:  # its sweep database and MLflow user: Secrets, Jobs
                assert obj["metadata"]["name"].startswith((f"trainforge-sweeps-{team.name}", f"trainforge-mlflow-user-{team.name}"))
                assert obj["kind"] in ("ConfigMap", "Secret", "Job")
            elif obj["metadata"].get("namespace") == contract.NAMESPACE_SYSTEM:  # the Job that makes its FSx directory
                assert (obj["kind"], obj["metadata"]["name"]) == ("Job", f"fsx-dir-{team.name}")
            elif obj["metadata"].get("namespace") == storage.QUOTA_NAMESPACE:  # the Job that sets its FSx quota
                assert obj["kind"] == "Job" and obj["metadata"]["name"].startswith(f"fsx-quota-{team.name}-")
            elif obj["kind"] not in ("Namespace", "ClusterQueue"):
                assert obj["metadata"]["namespace"] == contract.namespace_name(team.name)
        namespace = one(objects, "Namespace")["metadata"]["labels"]
        assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"  # every rendered pod meets it: tests/test_isolation.py


def test_quotas_equal_the_config(stack):
    evaluation, cfg = stack
    for team in cfg.teams:
        objects = team_objects(evaluation, team.name)
        queue = one(objects, "ClusterQueue")["spec"]
        assert queue["cohortName"] == contract.KUEUE_COHORT
        nominal = {f["name"]: next(r for r in f["resources"] if r["name"] == contract.RESOURCE_GPU) for f in queue["resourceGroups"][0]["flavors"]}
        assert Flavour.SYSTEM.value not in nominal, "no team is ever admitted onto the system nodes"
        assert nominal.pop(Flavour.CPU.value)["nominalQuota"] == 0, "CPU-only jobs: the cpu flavour, no GPUs"
        cpu_entry = next(f for f in queue["resourceGroups"][0]["flavors"] if f["name"] == Flavour.CPU.value)
        assert next(r for r in cpu_entry["resources"] if r["name"] == "cpu")["nominalQuota"] == team.cpu_quota
        assert {name: gpu["nominalQuota"] for name, gpu in nominal.items()} == {f.value: n for f, n in team.gpu_quota.items() if n > 0}
        for flavour, gpu in nominal.items():
            assert gpu["borrowingLimit"] == team.borrowing_limit.get(Flavour(flavour), 0)
        assert queue["preemption"]["reclaimWithinCohort"] == "Any"
        hard = one(objects, "ResourceQuota")["spec"]["hard"]
        assert int(hard[f"requests.{contract.RESOURCE_GPU}"]) == sum(team.reachable_gpus(f) for f in contract.GPU_FLAVOURS)
        local = one(objects, "LocalQueue")
        assert local["metadata"]["name"] == contract.queue_name(team.name) and local["spec"]["clusterQueue"] == contract.cluster_queue_name(team.name)
        account = one(objects, "ServiceAccount", contract.TRAINING_SERVICE_ACCOUNT)
        assert account["metadata"]["name"] == contract.TRAINING_SERVICE_ACCOUNT
        assert account["metadata"]["annotations"][contract.IRSA_ROLE_ANNOTATION] == evaluation.outputs["team_role_arns"][team.name]
        settings = one(objects, "ConfigMap", contract.TEAM_SETTINGS_CONFIG_MAP)["data"]
        assert float(settings["monthly_budget_usd"]) == team.monthly_budget_usd and settings["region"] == cfg.region


def test_members_reach_the_cluster_as_their_team(stack):
    evaluation, cfg = stack
    entries = {e.inputs["principalArn"]: e.inputs["kubernetesGroups"] for e in evaluation.of_type("aws:eks/accessEntry:AccessEntry")
               if e.inputs.get("kubernetesGroups")}
    for team in cfg.teams:
        for member in team.members:
            assert entries[member] == [contract.team_group(team.name), contract.ORGANISATION_GROUP]


# ---- isolation, evaluated -------------------------------------------------------------------------------------

def allowed(policy: dict, action: str, resource: str, context: dict[str, str]) -> bool:
    """IAM's answer for one request under one identity policy: an Allow statement whose action, resource and
    conditions (StringLike) all match, and no matching Deny."""
    def matches(statement) -> bool:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if not any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in actions):
            return False
        if not any(fnmatch.fnmatchcase(resource, r) for r in resources):
            return False
        for operator, conditions in (statement.get("Condition") or {}).items():
            assert operator == "StringLike", operator
            for key, patterns in conditions.items():
                if not any(fnmatch.fnmatchcase(context.get(key, ""), p) for p in (patterns if isinstance(patterns, list) else [patterns])):
                    return False
        return True
    statements = policy["Statement"]
    return any(s["Effect"] == "Allow" and matches(s) for s in statements) and not any(s["Effect"] == "Deny" and matches(s) for s in statements)


def test_a_teams_identity_reaches_no_other_teams_prefixes(stack):
    evaluation, cfg = stack
    roles = {r.state["arn"]: r for r in evaluation.of_type("aws:iam/role:Role")}
    buckets = {b.inputs["tags"]["purpose"]: b.state["arn"] for b in evaluation.of_type("aws:s3/bucket:Bucket")}
    for team in cfg.teams:
        role = roles[evaluation.outputs["team_role_arns"][team.name]]
        (policy,) = [json.loads(p.inputs["policy"]) for p in evaluation.of_type("aws:iam/rolePolicy:RolePolicy") if p.inputs["role"] == role.id]
        for other in cfg.teams:
            prefix = contract.team_s3_prefix(other.name)
            for kind in ("checkpoints", "artifacts"):
                verdicts = {action: allowed(policy, action, f"{buckets[kind]}/{prefix}step-1/model.pt", {})
                            for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")}
                verdicts["s3:ListBucket"] = allowed(policy, "s3:ListBucket", buckets[kind], {"s3:prefix": prefix})
                assert all(verdicts.values()) == (other is team) and any(verdicts.values()) == (other is team), (team.name, other.name, kind, verdicts)


def test_a_teams_role_grants_nothing_in_another_namespace(stack):
    evaluation, cfg = stack
    objects = [manifest(r) for r in evaluation.resources if r.type.startswith("kubernetes:rbac.authorization.k8s.io/")]
    cluster_wide = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    # Cluster-wide grants: the budget controller's, to its own service account; and each team's group may `get` its own
    # ClusterQueue (cluster-scoped) and nothing else.
    subjects = [(s["kind"], s["name"], s.get("namespace")) for b in cluster_wide for s in b["subjects"]]
    # ... and each team's sweep controller, in its own namespace, reads the same queue (it admits trials as `submit` does).
    assert sorted(subjects) == sorted([("ServiceAccount", contract.BUDGET_CONTROLLER, contract.NAMESPACE_SYSTEM)] +
                                      [("Group", contract.team_group(t.name), None) for t in cfg.teams] +
                                      [("ServiceAccount", contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT, contract.namespace_name(t.name))
                                       for t in cfg.teams])
    for team in cfg.teams:
        (binding,) = [b for b in cluster_wide if b["subjects"][0]["name"] == contract.team_group(team.name)]
        (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == binding["roleRef"]["name"]]
        assert role["rules"] == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["get"],
                                  "resourceNames": [contract.cluster_queue_name(team.name)]}]
    for team in cfg.teams:
        namespace = contract.namespace_name(team.name)
        for binding in [o for o in objects if o["kind"] == "RoleBinding" and any(s["name"] == contract.team_group(team.name) for s in o["subjects"])]:
            assert binding["metadata"]["namespace"] == namespace and binding["roleRef"]["kind"] == "Role"
            role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == binding["roleRef"]["name"]
                        and o["metadata"]["namespace"] == namespace)
            assert [rule.get("resourceNames") for rule in role["rules"] if "secrets" in rule["resources"]] == \
                [[contract.SWEEP_STORAGE_SECRET, contract.MLFLOW_SECRET]], "no Secret but the team's study database URL and MLflow user"
        organisation = [o for o in objects if o["kind"] == "RoleBinding" and any(s["name"] == contract.ORGANISATION_GROUP for s in o["subjects"])
                        and o["metadata"]["namespace"] == namespace]
        assert [(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in organisation] == ([("ClusterRole", "view")] if team.visible_to_organisation else [])


def admitted(policies: list[dict], from_namespace: str, port: int, own_namespace: str) -> bool:
    """Whether NetworkPolicy lets a pod in `from_namespace` reach port `port` of a pod in `own_namespace`."""
    selecting = [p for p in policies if p["spec"]["podSelector"] == {} and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    def peer_admits(peer: dict) -> bool:
        if "ipBlock" in peer:
            return True  # an address range can hold any pod: count it as admitting everyone
        if "namespaceSelector" in peer:
            labels = peer["namespaceSelector"].get("matchLabels", {})
            expressions = peer["namespaceSelector"].get("matchExpressions", [])
            assert not expressions, "extend the model before using matchExpressions"
            return all({"kubernetes.io/metadata.name": from_namespace}.get(k) == v for k, v in labels.items())  # {} selects every namespace
        return from_namespace == own_namespace  # a podSelector alone means this namespace

    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers_ok = "from" not in rule or any(peer_admits(peer) for peer in rule["from"])
            ports_ok = not rule.get("ports") or any(p.get("port") == port for p in rule["ports"])
            if peers_ok and ports_ok:
                return True
    return False


def test_network_policies_admit_no_other_team(stack):
    evaluation, cfg = stack
    for team in cfg.teams:
        namespace = contract.namespace_name(team.name)
        policies = [o for o in team_objects(evaluation, team.name) if o["kind"] == "NetworkPolicy"]
        assert admitted(policies, namespace, 29500, namespace), "ranks of one job must reach each other (rendezvous)"
        assert admitted(policies, contract.NAMESPACE_MONITORING, contract.METRICS_PORT, namespace)
        assert not admitted(policies, contract.NAMESPACE_MONITORING, 22, namespace)
        for other in cfg.teams:
            if other is not team:
                for port in (22, 443, 29500, contract.METRICS_PORT):
                    assert not admitted(policies, contract.namespace_name(other.name), port, namespace), (team.name, other.name, port)
        deny = one(policies, "NetworkPolicy", "default-deny")["spec"]
        assert set(deny["policyTypes"]) == {"Ingress", "Egress"} and "ingress" not in deny and "egress" not in deny


# ---- onboarding and config -------------------------------------------------------------------------------------

def test_onboarding_a_team_adds_exactly_that_teams_objects(tmp_path):
    from trainforge.platform.plan.plan import difference, make_plan
    import yaml
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["teams"].append({"name": "robotics", "cost_centre": "cc-3001", "gpu_quota": {"gpu-spot": 2}, "monthly_budget_usd": 500,
                         "members": ["arn:aws:iam::111122223333:role/sso-rob"]})
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": {CONFIG_KEY: raw}}))
    diff = difference(make_plan(REPO / "stacks" / "Pulumi.dev.yaml"), make_plan(path))
    assert diff.removed == [] and diff.changed == []
    assert all("robotics" in name for name in diff.added), [n for n in diff.added if "robotics" not in n]
    kinds = {name.split()[0] for name in diff.added}
    assert {"trainforge:platform:Tenancy", "kubernetes:core/v1:Namespace", "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue",
            "kubernetes:networking.k8s.io/v1:NetworkPolicy", "aws:eks/accessEntry:AccessEntry", "aws:iam/role:Role"} <= kinds


@pytest.mark.parametrize("change, message", [
    ({"members": ["alice@example.com"]}, "e-mail addresses; EKS grants access to IAM principals"),
    ({"members": ["arn:aws:iam::111122223333:role/a", "arn:aws:iam::111122223333:role/a"]}, "lists a principal twice"),
    ({"lending_limit": {"gpu-spot": 99}}, "lending_limit"),
    ({"borrowing_limit": {"system": 2}}, "['system'] nodes have no GPUs"),
    ({"gpu_quota": {"cpu": 2}}, "['cpu'] nodes have no GPUs"),
    ({"priorities": ["normal", "urgent"]}, "['urgent']: priorities are some of ['low', 'normal', 'high']. Fix:"),
    ({"priorities": []}, "empty: priorities are some of"),
])
def test_bad_team_settings_are_rejected_with_the_fix(change, message):
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["teams"][0].update(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(raw, environment="dev", source="dev")


def test_each_team_has_its_own_sweep_database_reachable_only_on_the_database_port(stack):
    """The storage URL in team A's Secret names A's role and database only; A's Job creates only those; its pods
    may leave the namespace for PostgreSQL on 5432 inside the VPC, nothing more."""
    evaluation, cfg = stack
    for team in cfg.teams:
        objects = team_objects(evaluation, team.name)
        database, role = contract.sweep_database(team.name)
        url = one(objects, "Secret", contract.SWEEP_STORAGE_SECRET)["stringData"][contract.SWEEP_STORAGE_KEY]
        assert url.startswith(f"postgresql+psycopg2://{role}:") and url.endswith(f":5432/{database}?sslmode=require")
        sql = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["namespace"] == contract.NAMESPACE_MLFLOW)["data"]["sweeps.sql"]
        for other in cfg.teams:
            if other is not team:
                assert all(name not in sql and name not in url for name in contract.sweep_database(other.name))
        job = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("trainforge-sweeps-"))["spec"]["template"]["spec"]
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in job["containers"][0]["env"] if "valueFrom" in e}
        assert refs == {"mlflow-database", f"trainforge-sweeps-{team.name}"}
        egress = one(objects, "NetworkPolicy", "allow-sweep-database")["spec"]["egress"]
        assert egress == [{"to": [{"ipBlock": {"cidr": str(cfg.network.vpc_cidr)}}], "ports": [{"protocol": "TCP", "port": 5432}]}]


def test_the_sweep_controller_may_do_nothing_a_member_may_not(stack):
    """Any member can name the controller's ServiceAccount in a job of theirs: its Role must stay within theirs."""
    evaluation, cfg = stack
    from trainforge.platform.manifests import tenancy
    objects = [o for o in (manifest(r) for r in evaluation.resources if r.type.startswith("kubernetes:")) if o.get("kind")]
    for team in cfg.teams:
        namespace = contract.namespace_name(team.name)

        def role(name: str) -> dict:
            (found,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == name and o["metadata"]["namespace"] == namespace]
            return found
        (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == namespace
                      and any(s["name"] == contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT for s in o["subjects"])]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT, "namespace": namespace}]
        member = role(tenancy.MEMBER_ROLE)["rules"]
        for rule in role(binding["roleRef"]["name"])["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        covering = [m for m in member if group in m["apiGroups"] and resource in m["resources"] and verb in m["verbs"]
                                    and (not m.get("resourceNames") or set(rule.get("resourceNames") or ["*"]) <= set(m["resourceNames"]))]
                        assert covering, f"the controller may {verb} {resource} and a member may not"
        (account,) = [o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT
                      and o["metadata"]["namespace"] == namespace]
        assert account["automountServiceAccountToken"] is False, "only the controller's pod projects a token"


# ---- FSx quotas: one team cannot fill the shared file system --------------------------------------------------------

def test_each_teams_fsx_quota_is_set_on_the_group_its_pods_must_run_as_before_the_team_starts(stack):
    """The Job sets a hard group quota (KiB) on the gid the admission policy makes every team pod run as, on the same
    file system the team's volume mounts, with SYS_ADMIN alone (Lustre's check for setting a quota), in kube-system; the
    team's queue waits for it, so no job of the team writes before its quota holds."""
    from trainforge import versions
    from trainforge.platform.manifests import guardrails
    evaluation, cfg = stack
    objects = {(r.type.rsplit(":", 1)[-1], manifest(r)["metadata"].get("namespace"), manifest(r)["metadata"]["name"]): r
               for r in evaluation.resources if r.type.startswith("kubernetes:") and "helm.sh" not in r.type}
    claim = objects[("PersistentVolumeClaim", storage.QUOTA_NAMESPACE, storage.QUOTA_ROOT_CLAIM)]
    volume = manifest(objects[("PersistentVolume", None, manifest(claim)["spec"]["volumeName"])])
    assert volume["spec"]["claimRef"] == {"namespace": storage.QUOTA_NAMESPACE, "name": storage.QUOTA_ROOT_CLAIM}
    team_volume = manifest(objects[("PersistentVolume", None, f"{contract.FSX_CLAIM_NAME}-{cfg.teams[0].name}")])
    root, team_fileset = volume["spec"]["csi"]["volumeAttributes"], team_volume["spec"]["csi"]["volumeAttributes"]
    assert root["dnsname"] == team_fileset["dnsname"] and team_fileset["mountname"].startswith(root["mountname"] + "/"), \
        "the root of the file system the teams write"
    handles = [manifest(r)["spec"]["csi"]["volumeHandle"] for r in evaluation.resources if r.type.endswith(":PersistentVolume")]
    assert len(handles) == len(set(handles)), "each PV its own handle"
    assert all(cfg.fsx_quota_gib(team) is not None for team in cfg.teams), "the shipped stacks give every team a quota"
    for team in cfg.teams:
        (job_resource,) = [r for (kind, namespace, name), r in objects.items()
                           if kind == "Job" and namespace == storage.QUOTA_NAMESPACE and name.startswith(f"fsx-quota-{team.name}-")]
        job = manifest(job_resource)
        pod = job["spec"]["template"]["spec"]
        settings = one(team_objects(evaluation, team.name), "ConfigMap", "trainforge-team")["data"]
        gid = settings[guardrails.PARAM_GID]
        (setquota,) = pod["initContainers"]
        assert setquota["command"] == ["lfs", "setquota", "-g", gid, "-b", "0", "-B", str(cfg.fsx_quota_gib(team) * 1024 * 1024),
                                       "-i", "0", "-I", "0", contract.FSX_MOUNT_PATH]
        for container in (*pod["initContainers"], *pod["containers"]):
            assert container["image"] == versions.FSX_QUOTA_JOB_IMAGE
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["volumes"] == [{"name": "fsx", "persistentVolumeClaim": {"claimName": storage.QUOTA_ROOT_CLAIM}}]
        assert evaluation.depends_on(job_resource, claim)
        queue = objects[("ClusterQueue", None, contract.namespace_name(team.name))]
        assert evaluation.depends_on(queue, job_resource), team.name


def test_a_changed_quota_is_a_new_job_and_an_unchanged_one_is_not_run_again():
    same = storage.team_quota_job("vision", 300, {})["metadata"]["name"]
    assert storage.team_quota_job("vision", 300, {})["metadata"]["name"] == same
    assert storage.team_quota_job("vision", 400, {})["metadata"]["name"] != same
    assert storage.team_quota_job("language", 300, {})["metadata"]["name"] != same


@pytest.mark.parametrize("fsx, teams, message", [
    ({"team_quota_gib": 1300}, {}, "teams[0].fsx_quota_gib: team 'vision' may hold 1300 GiB but the file system has 1200 GiB. "
                                   "Fix: at most 1200, or raise fsx.storage_capacity_gib"),
    ({"team_quota_gib": 300}, {0: {"fsx_quota_gib": 1000}}, "the teams' FSx quotas add up to 1300 GiB (vision 1000, language 300) "
                                                             "but the file system has 1200 GiB"),
    ({"team_quota_gib": 0}, {}, "fsx.team_quota_gib"),
    ({}, {1: {"fsx_quota_gib": -5}}, "teams[1].fsx_quota_gib"),
])
def test_fsx_quotas_that_do_not_fit_the_file_system_are_refused_with_the_fix(fsx, teams, message):
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["fsx"].update(fsx)
    for index, change in teams.items():
        raw["teams"][index].update(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(raw, environment="dev", source="dev")


def test_a_team_stacks_quota_counts_in_its_platforms_cohort(tmp_path):
    """Declared in its own stack, a team's quota still adds to the file system's: the cohort is checked as one."""
    import yaml

    from trainforge.stackconfig.team_stacks import CohortError, load_cohort
    for name in ("Pulumi.dev.yaml", "Pulumi.dev.team-audio.yaml"):
        (tmp_path / name).write_text((REPO / "stacks" / name).read_text())
    assert load_cohort(tmp_path / "Pulumi.dev.yaml").teams
    team_file = tmp_path / "Pulumi.dev.team-audio.yaml"
    doc = yaml.safe_load(team_file.read_text())
    (key,) = [k for k in doc["config"] if k.endswith(":team")]
    doc["config"][key]["fsx_quota_gib"] = 700
    team_file.write_text(yaml.safe_dump(doc))
    with pytest.raises(CohortError, match=re.escape("the teams' FSx quotas add up to 1300 GiB (audio 700, vision 300, language 300)")):
        load_cohort(tmp_path / "Pulumi.dev.yaml")
