"""Teams cannot reach each other's files or go round their queue — over the objects the program creates, every stack.

- Storage: a team's PVs mount only its own directory of the file system (read-write) and the datasets (read-only);
  no PV bound to a team mounts the root; the data repository never exports back to the datasets bucket.
- Identity: the pods the operators would build from a rendered job run as the team's own uid/gid; the program's
  admission policies (their CEL evaluated by cel-python, tests/support/admission_policies.py) admit them in their team's
  namespace and refuse them in another's, and refuse every way a job author could try to change identity or storage.
- Queues: the policies refuse a job that leaves out its team's LocalQueue or names another; Kueue also manages
  queue-less jobs in team namespaces.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from support.pod_security import restricted_violations
from support.repo import REPO
from support.evaluated import kubernetes_objects, manifest, releases
from support.repo import SPECS

from trainforge import contract, selectors
from trainforge.platform.manifests import guardrails
from trainforge.trainer.placement import decide
from trainforge.trainer.render import job_paths, render
from trainforge.trainer.spec import load_spec
from support.cluster import PODS, PYTORCHJOBS, Program, TRAINJOBS


@pytest.fixture
def program(stack):
    evaluation, cfg = stack
    return Program(evaluation), cfg


def rendered(cfg, team: str, path=REPO / "examples" / "quickstart.yaml", kind: str = "trainjob") -> dict:
    """As the CLI renders it: the stack's image filled in where the spec names none."""
    from trainforge.trainer.spec import with_image
    spec = with_image(load_spec(path).model_copy(update={"team": team}), cfg)
    return render(spec, decide(spec, cfg), kind)


def in_namespace(obj: dict, namespace: str) -> dict:
    moved = copy.deepcopy(obj)
    moved["metadata"]["namespace"] = namespace
    return moved


# ---- storage ----------------------------------------------------------------------------------------------------

def test_each_team_mounts_only_its_own_directory_and_the_datasets_read_only(program):
    prog, cfg = program
    pvs = [o for o in prog.objects if o["kind"] == "PersistentVolume"]
    root = next(pv for pv in pvs if pv["metadata"]["name"] == "trainforge-fsx-root")["spec"]["csi"]
    handles = [pv["spec"]["csi"]["volumeHandle"] for pv in pvs]
    assert len(handles) == len(set(handles)), "two PVs with one handle are one volume to the kubelet"
    for team in cfg.teams:
        namespace = contract.namespace_name(team.name)
        bound = {pv["spec"]["claimRef"]["name"]: pv["spec"] for pv in pvs if pv["spec"]["claimRef"]["namespace"] == namespace}
        assert set(bound) == {contract.FSX_CLAIM_NAME, contract.FSX_DATASETS_CLAIM_NAME}
        own, datasets = bound[contract.FSX_CLAIM_NAME], bound[contract.FSX_DATASETS_CLAIM_NAME]
        assert own["csi"]["volumeAttributes"]["mountname"] == f"{root['volumeAttributes']['mountname']}/teams/{team.name}"
        assert datasets["csi"]["volumeAttributes"]["mountname"] == root["volumeAttributes"]["mountname"] + cfg.fsx.datasets_path
        assert datasets["csi"]["readOnly"] is True and "ro" in datasets["mountOptions"] and datasets["accessModes"] == ["ReadOnlyMany"]
        for spec in (own, datasets):
            assert spec["csi"]["volumeAttributes"]["dnsname"] == root["volumeAttributes"]["dnsname"]
        # A rendered job of the team writes only under its mounted directory and reads datasets read-only.
        for kind in ("trainjob", "pytorchjob"):
            for pod in prog.pods(in_namespace(rendered(cfg, team.name, kind=kind), namespace)):
                claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
                for container in pod["spec"]["containers"]:
                    mounts = {m["mountPath"]: m for m in container["volumeMounts"] if m["name"] in claims}
                    assert {p: claims[m["name"]]["claimName"] for p, m in mounts.items()} == {
                        contract.fsx_team_dir(team.name): contract.FSX_CLAIM_NAME, contract.FSX_DATASETS_MOUNT: contract.FSX_DATASETS_CLAIM_NAME}
                    assert mounts[contract.FSX_DATASETS_MOUNT]["readOnly"] is True
        spec = load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={"team": team.name})
        assert all(p.startswith(contract.fsx_team_dir(team.name) + "/") for p in job_paths(spec).values())


def test_the_data_repository_never_writes_the_datasets_bucket(stack):
    evaluation, cfg = stack
    for dra in evaluation.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"):
        assert dra.inputs["s3"]["autoExportPolicy"]["events"] == []
        assert dra.inputs["fileSystemPath"] == cfg.fsx.datasets_path


# ---- identity ----------------------------------------------------------------------------------------------------

def test_every_team_has_its_own_identity_in_its_settings(program):
    prog, cfg = program
    ids = {}
    for team in cfg.teams:
        data = prog.param(contract.namespace_name(team.name), contract.TEAM_SETTINGS_CONFIG_MAP)["data"]
        assert data[guardrails.PARAM_UID] == data[guardrails.PARAM_GID] == str(contract.team_posix_id(team.name))
        assert int(data[guardrails.PARAM_UID]) not in (0, contract.RUNTIME_UID)
        ids[team.name] = data[guardrails.PARAM_UID]
    assert len(set(ids.values())) == len(ids)


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_rendered_pods_are_admitted_in_their_own_namespace_and_no_other(program, path, kind):
    prog, cfg = program
    if len(cfg.teams) < 2:
        pytest.skip("one team")
    spec = load_spec(path)
    if not decide(spec.model_copy(update={"team": cfg.teams[0].name}), cfg).flavours:
        pytest.skip(f"{path.name} fits no node group of this stack: `check` refuses it before anything is rendered")
    for team, other in zip(cfg.teams, cfg.teams[1:] + cfg.teams[:1]):
        job = in_namespace(rendered(cfg, team.name, path, kind), contract.namespace_name(team.name))
        if spec.priority not in team.priorities:  # test_a_team_uses_only_the_priorities_its_stack_grants
            assert [m for m in prog.denials(job, TRAINJOBS if kind == "trainjob" else PYTORCHJOBS) if "team's priorities" in m]
            continue
        assert prog.denials(job, TRAINJOBS if kind == "trainjob" else PYTORCHJOBS) == []
        for pod in prog.pods(job):
            assert pod["spec"]["securityContext"]["runAsUser"] == contract.team_posix_id(team.name)
            assert prog.denials(pod, PODS) == [], pod["metadata"]["name"]
            elsewhere = prog.denials(in_namespace(pod, contract.namespace_name(other.name)), PODS)
            assert any("team's uid" in m for m in elsewhere), f"{team.name}'s pod would run as itself in {other.name}'s namespace"


def test_a_team_uses_only_the_priorities_its_stack_grants(program):
    """`high` preempts the cohort's lower-priority work: a team's jobs may carry only the priorities its stack config
    grants (issue 37, minor). The cluster refuses another (the jobs admission policy over the team's settings), and
    `check` says so first, naming the fix."""
    from trainforge.trainer.admission import admit
    prog, cfg = program
    granted = [t for t in cfg.teams if "high" in t.priorities]
    others = [t for t in cfg.teams if "high" not in t.priorities]
    if not granted or not others:
        pytest.skip("the stack grants high to every team or to none")
    for team in cfg.teams:
        settings = next(o for o in prog.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == contract.TEAM_SETTINGS_CONFIG_MAP
                        and o["metadata"]["namespace"] == contract.namespace_name(team.name))
        assert {v for k, v in settings["data"].items() if k.startswith(contract.SETTING_PRIORITY_PREFIX)} == \
            {contract.priority_class_name(p) for p in team.priorities}
        for priority in contract.PRIORITIES:
            spec = load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={"team": team.name, "priority": priority})
            from trainforge.trainer.spec import with_image
            spec = with_image(spec, cfg)
            job = in_namespace(render(spec, decide(spec, cfg), "trainjob"), contract.namespace_name(team.name))
            refused = [m for m in prog.denials(job, TRAINJOBS) if "team's priorities" in m]
            said = [p for p in admit(spec, cfg).problems if p.startswith("priority:")]
            assert bool(refused) == bool(said) == (priority not in team.priorities), (team.name, priority, refused, said)
            assert all("teams[].priorities" in m for m in refused + said)


def _trainjob_pod(prog, cfg) -> dict:
    team = cfg.teams[0].name
    (pod, *_) = prog.pods(in_namespace(rendered(cfg, team), contract.namespace_name(team)))
    return pod


TAMPERING = {
    "run as root": lambda pod: pod["spec"]["securityContext"].update(runAsUser=0),
    "no security context": lambda pod: pod["spec"].pop("securityContext"),
    "a container runs as another uid": lambda pod: pod["spec"]["containers"][0].update(securityContext={"runAsUser": 1000}),
    "an init container runs as root": lambda pod: pod["spec"].update(initContainers=[{"name": "x", "image": "busybox", "securityContext": {"runAsUser": 0}}]),
    "another group": lambda pod: pod["spec"]["securityContext"].update(runAsGroup=1000),
    "a supplemental group": lambda pod: pod["spec"]["securityContext"].update(supplementalGroups=[1000]),
    "another fsGroup": lambda pod: pod["spec"]["securityContext"].update(fsGroup=0),
    "groups from the image's /etc/group": lambda pod: pod["spec"]["securityContext"].pop("supplementalGroupsPolicy"),
    "groups merged with the image's": lambda pod: pod["spec"]["securityContext"].update(supplementalGroupsPolicy="Merge"),
    "hostPath": lambda pod: pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    "an inline CSI volume": lambda pod: pod["spec"]["volumes"].append({"name": "c", "csi": {"driver": "fsx.csi.aws.com"}}),
    "NFS": lambda pod: pod["spec"]["volumes"].append({"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}),
    "another claim": lambda pod: pod["spec"]["volumes"].append({"name": "o", "persistentVolumeClaim": {"claimName": "someone-elses"}}),
    "an ephemeral claim": lambda pod: pod["spec"]["volumes"].append({"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
    # Resources that count (issue 37, item 5): zero is no limit and uncounted quota.
    "zero cpu": lambda pod: pod["spec"]["containers"][0]["resources"].update(limits={**pod["spec"]["containers"][0]["resources"]["limits"], "cpu": "0"},
                                                                             requests={**pod["spec"]["containers"][0]["resources"]["requests"], "cpu": "0"}),
    "zero memory written as 0.0Gi": lambda pod: pod["spec"]["containers"][0]["resources"].update(
        limits={**pod["spec"]["containers"][0]["resources"]["limits"], "memory": "0.0Gi"}),
    "a zero request under a real limit": lambda pod: pod["spec"]["containers"][0]["resources"]["requests"].update(cpu="0m"),
    "zero scratch disk": lambda pod: pod["spec"]["containers"][0]["resources"].update(
        limits={**pod["spec"]["containers"][0]["resources"]["limits"], contract.RESOURCE_EPHEMERAL_STORAGE: "0"}),
    "no scratch disk limit": lambda pod: pod["spec"]["containers"][0]["resources"]["limits"].pop(contract.RESOURCE_EPHEMERAL_STORAGE),
    "no limits": lambda pod: pod["spec"]["containers"][0]["resources"].pop("limits"),
    # Images only from the platform's registries (issue 37, minor).
    "an image from anywhere": lambda pod: pod["spec"]["containers"][0].update(image="docker.io/someone/miner:latest"),
    "a registry that only begins like the stack's": lambda pod: pod["spec"]["containers"][0].update(
        image=pod["spec"]["containers"][0]["image"].split("/")[0] + ".evil.example/x:1"),
    "an init container from anywhere": lambda pod: pod["spec"].update(initContainers=[{
        **pod["spec"]["containers"][0], "name": "x", "image": "ghcr.io/someone/x:1"}]),
    "no resources at all": lambda pod: pod["spec"]["containers"][0].pop("resources"),
    "an init container without limits": lambda pod: pod["spec"].update(initContainers=[{"name": "x", "image": "busybox"}]),
    # Placement: a team's pod lands only on tenant nodes (issue 26, item 5).
    "the system nodes": lambda pod: pod["spec"]["nodeSelector"].update({contract.LABEL_FLAVOUR: contract.Flavour.SYSTEM.value}),
    "no flavour at all": lambda pod: pod["spec"]["nodeSelector"].pop(contract.LABEL_FLAVOUR),
    "a node by name": lambda pod: pod["spec"].update(nodeName="ip-10-0-1-23.ec2.internal"),
    "an affinity term that reaches the system nodes": lambda pod: (pod["spec"]["nodeSelector"].pop(contract.LABEL_FLAVOUR), pod["spec"].update(
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": contract.LABEL_FLAVOUR, "operator": "In", "values": ["cpu"]}]},
            {"matchExpressions": [{"key": contract.LABEL_NODE_GROUP, "operator": "In", "values": ["system"]}]}]}}})),
    "an affinity that names the system flavour": lambda pod: (pod["spec"]["nodeSelector"].pop(contract.LABEL_FLAVOUR), pod["spec"].update(
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": contract.LABEL_FLAVOUR, "operator": "In", "values": ["cpu", "system"]}]}]}}})),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERING))
def test_the_pod_policy_refuses_what_a_job_author_could_try(program, tamper):
    prog, cfg = program
    pod = _trainjob_pod(prog, cfg)
    assert prog.denials(pod, PODS) == []
    TAMPERING[tamper](pod)
    refused = prog.denials(pod, PODS)
    assert refused, f"admitted: {tamper}"
    assert not any(m.startswith("expression error") for m in refused), refused  # refused by the rule, not by accident


def test_no_settings_no_admission(program):
    prog, cfg = program
    pod = _trainjob_pod(prog, cfg)
    prog.objects = [o for o in prog.objects if not (o["kind"] == "ConfigMap" and o["metadata"]["name"] == contract.TEAM_SETTINGS_CONFIG_MAP)]
    assert any("failed to find params" in m for m in prog.denials(pod, PODS))


def test_the_policies_cover_every_team_namespace_and_no_platform_one(program):
    prog, cfg = program
    pod = _trainjob_pod(prog, cfg)
    pod["spec"]["securityContext"]["runAsUser"] = 0
    for namespace in [o["metadata"]["name"] for o in prog.objects if o["kind"] == "Namespace"]:
        is_team = namespace in {contract.namespace_name(t.name) for t in cfg.teams}
        assert bool(prog.denials(in_namespace(pod, namespace), PODS)) == is_team, namespace


# ---- queues -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_a_job_must_name_its_own_teams_queue(program, kind):
    prog, cfg = program
    resource = TRAINJOBS if kind == "trainjob" else PYTORCHJOBS
    for team in cfg.teams:
        job = in_namespace(rendered(cfg, team.name, kind=kind), contract.namespace_name(team.name))
        assert prog.denials(job, resource) == []
        assert prog.denials(job, resource, "UPDATE") == []
        labels = job["metadata"]["labels"]
        for change in ({contract.KUEUE_QUEUE_LABEL: None}, {contract.KUEUE_QUEUE_LABEL: "default"},
                       *({contract.KUEUE_QUEUE_LABEL: contract.queue_name(o.name)} for o in cfg.teams if o is not team),
                       {contract.KUEUE_PRIORITY_LABEL: "urgent"}):
            changed = copy.deepcopy(job)
            for key, value in change.items():
                changed["metadata"]["labels"].pop(key) if value is None else changed["metadata"]["labels"].update({key: value})
            refused = prog.denials(changed, resource)
            assert refused and not any(m.startswith("expression error") for m in refused), (change, refused, labels)


def test_kueue_manages_queue_less_jobs_in_every_team_namespace(stack):
    evaluation, cfg = stack
    values = yaml.safe_load(releases(evaluation)["kueue"]["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert values["manageJobsWithoutQueueName"] is True
    prog = Program(evaluation)
    for team in cfg.teams:
        assert selectors.matches(values["managedJobsNamespaceSelector"], prog.namespace_labels(contract.namespace_name(team.name)))


# ---- bad inputs that would cross a line -----------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["check", "submit"])
@pytest.mark.parametrize("spent", ["nan", "-1e9", "inf"])
def test_a_spend_that_is_not_an_amount_is_refused(tmp_path, command, spent):
    import os
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", command, str(REPO / "examples" / "quickstart.yaml"),
                             "--spent", spent], capture_output=True, text=True, env={**os.environ, "TRAINFORGE_HOME": str(tmp_path), "COLUMNS": "300"}, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--spent" in result.stderr and "Fix: USD this month, 0 or more" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir()), "nothing submitted"


def _raw(name: str) -> dict:
    from trainforge.stackconfig import CONFIG_KEY, read_stack_file
    return copy.deepcopy(read_stack_file(REPO / "stacks" / f"Pulumi.{name}.yaml").config[CONFIG_KEY])


@pytest.mark.parametrize("change, message", [
    ({"auto_export": True}, r"fsx\.data_repository.*auto_export: the datasets bucket is read-only to teams"),
    ({"file_system_path": "/"}, r"file_system_path: '/' would put the repository over the teams' directories"),
    ({"file_system_path": "/teams/vision"}, r"over the teams' directories"),
    ({"file_system_path": "/./teams"}, r"has an empty, '\.' or '\.\.' segment"),
    ({"file_system_path": "/datasets/../teams/vision"}, r"segment"),
    ({"file_system_path": "//teams"}, r"segment"),
])
def test_a_data_repository_that_would_let_teams_write_or_reach_others_is_refused(change, message):
    from trainforge.stackconfig import ConfigError, parse
    raw = _raw("dev")
    raw["fsx"]["data_repository"].update(change)
    with pytest.raises(ConfigError, match=message):
        parse(raw, environment="dev", source="Pulumi.dev.yaml")


def test_two_teams_with_one_posix_id_are_refused(monkeypatch):
    from trainforge.stackconfig import ConfigError, parse
    monkeypatch.setattr(contract, "TEAM_POSIX_ID_SPAN", 1)  # every name lands on one id: the collision the rule is for
    with pytest.raises(ConfigError, match=r"teams\[1\]\.name: 'language' has the same POSIX id \(1000000\) as team 'vision'.*Fix: rename"):
        parse(_raw("dev"), environment="dev", source="Pulumi.dev.yaml")


# ---- pod security ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_rendered_pods_meet_the_restricted_pod_security_standard_their_namespace_enforces(program, path, kind):
    prog, cfg = program
    team = cfg.teams[0].name
    namespace = prog.one("Namespace", contract.namespace_name(team))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for pod in prog.pods(in_namespace(rendered(cfg, team, path, kind), contract.namespace_name(team))):
        assert restricted_violations(pod["spec"]) == [], pod["metadata"]["name"]
        assert pod["spec"]["automountServiceAccountToken"] is False  # no Kubernetes API token in a training pod


def test_the_training_service_account_mounts_no_api_token(program):
    prog, cfg = program
    for team in cfg.teams:
        account = prog.one("ServiceAccount", contract.TRAINING_SERVICE_ACCOUNT, contract.namespace_name(team.name))
        assert account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("tamper,finding", [
    (lambda c, s: c.update(securityContext={"privileged": True}), "privileged"),
    (lambda c, s: c["securityContext"].update(allowPrivilegeEscalation=True), "privilege escalation"),
    (lambda c, s: c["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}), "capabilities"),
    (lambda c, s: s.update(hostNetwork=True), "host namespaces"),
    (lambda c, s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    (lambda c, s: s["securityContext"].update(runAsUser=0), "non-root user"),
], ids=["privileged", "escalation", "SYS_ADMIN", "hostNetwork", "hostPath", "root"])
def test_the_standard_as_checked_here_refuses_what_restricted_refuses(program, tamper, finding):
    """The checker is not a rubber stamp: each thing `restricted` forbids, put into a rendered pod, is found."""
    prog, cfg = program
    pod = copy.deepcopy(_trainjob_pod(prog, cfg))
    tamper(pod["spec"]["containers"][0], pod["spec"])
    assert any(finding in v for v in restricted_violations(pod["spec"])), restricted_violations(pod["spec"])


# ---- placement: tenants never on the platform's nodes ---------------------------------------------------------------

def _system_and_tenant_templates(cfg):
    from trainforge import nodes
    templates = {g.name: (g.flavour, nodes.template(g)) for g in cfg.node_groups}
    system = [t for f, t in templates.values() if f is contract.Flavour.SYSTEM]
    assert system, "every stack has system nodes"
    return system, [t for f, t in templates.values() if f is not contract.Flavour.SYSTEM]


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_no_admitted_team_pod_can_be_scheduled_onto_a_system_node(program, path, kind):
    """The scheduler's own test (node selector, affinity, taints, the autoscaler's template of each group) says no
    pod of any rendered job fits a system node, and each fits some tenant group."""
    from trainforge import nodes
    prog, cfg = program
    spec = load_spec(path).model_copy(update={"team": cfg.teams[0].name})
    if not decide(spec, cfg).flavours:
        pytest.skip(f"{path.name} fits no node group of this stack: `check` refuses it before anything is rendered")
    system, tenant = _system_and_tenant_templates(cfg)
    job = in_namespace(rendered(cfg, spec.team, path, kind), contract.namespace_name(spec.team))
    for pod in prog.pods(job):
        assert prog.denials(pod, PODS) == []
        requests = nodes.requests_of(pod["spec"]["containers"][0].get("resources", {}).get("requests", {}))
        shape = nodes.PodShape.of_pod_spec(pod["spec"], requests)
        for node in system:
            assert nodes.fit_problems(shape, node), f"{pod['metadata']['name']} could land on {node.group}"
        assert nodes.scale_up_candidates(shape, tenant), f"{pod['metadata']['name']} fits no tenant group"


def cpu_only(cfg):
    """The quickstart asking for no GPU: 4 CPUs and 8 GiB per worker."""
    from trainforge.trainer.spec import Resources
    from trainforge.trainer.spec import with_image
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    return with_image(spec.model_copy(update={"team": cfg.teams[0].name, "resources": Resources(cpu="4", memory="8Gi")}), cfg)


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_a_cpu_only_job_goes_to_the_cpu_group_and_never_the_system_one(program, kind):
    from trainforge import nodes
    prog, cfg = program
    spec = cpu_only(cfg)
    assert spec.resources.gpus() == 0
    where = decide(spec, cfg)
    assert where.flavours == (contract.Flavour.CPU,)
    system, tenant = _system_and_tenant_templates(cfg)
    for pod in prog.pods(in_namespace(render(spec, where, kind), contract.namespace_name(spec.team))):
        assert prog.denials(pod, PODS) == []
        shape = nodes.PodShape.of_pod_spec(pod["spec"], nodes.requests_of(pod["spec"]["containers"][0]["resources"]["requests"]))
        assert all(nodes.fit_problems(shape, node) for node in system)
        assert {t.group for t in nodes.scale_up_candidates(shape, tenant)} == {g.name for g in cfg.node_groups if g.flavour is contract.Flavour.CPU}
    queue = next(o for o in prog.objects if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == contract.cluster_queue_name(spec.team))
    assert contract.Flavour.CPU.value in [f["name"] for f in queue["spec"]["resourceGroups"][0]["flavors"]]
    assert all(f["name"] != contract.Flavour.SYSTEM.value for f in queue["spec"]["resourceGroups"][0]["flavors"])
    assert all(o["metadata"]["name"] != contract.Flavour.SYSTEM.value for o in prog.objects if o["kind"] == "ResourceFlavor")


def test_a_stack_without_a_cpu_group_refuses_cpu_jobs_with_the_fix(program):
    from trainforge.trainer.placement import group_problems
    prog, cfg = program
    without = cfg.model_copy(update={"node_groups": [g for g in cfg.node_groups if g.flavour is not contract.Flavour.CPU]})
    spec = cpu_only(cfg)
    (problem,) = group_problems(spec, without, contract.Flavour.CPU)
    assert "team_jobs: true" in problem
    assert group_problems(spec, cfg, contract.Flavour.SYSTEM) == ["the system nodes run only the platform's services, never a team's job"]


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_a_sweep_trial_pod_reads_its_database_url_from_a_mounted_file_and_is_admitted(program, kind):
    """The trial's study database URL (a password) is neither in the job nor in the pod's environment: the team's Secret
    is mounted read-only as one file; the pod still meets restricted and the team pod policy."""
    import json
    prog, cfg = program
    team = cfg.teams[0].name
    from trainforge.trainer.spec import with_image
    spec = with_image(load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={
        "team": team, "sweep": {"storage": contract.SWEEP_STORAGE_FROM_FILE, "study": "s", "trial_id": 3, "metric": "accuracy"}}), cfg)
    for pod in prog.pods(in_namespace(render(spec, decide(spec, cfg), kind), contract.namespace_name(team))):
        assert prog.denials(pod, PODS) == [] and restricted_violations(pod["spec"]) == []
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        (container,) = pod["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == contract.SWEEP_STORAGE_DIR]
        secret = volumes[mount["name"]]["secret"]
        assert mount["readOnly"] and secret["secretName"] == contract.SWEEP_STORAGE_SECRET
        assert secret["items"] == [{"key": contract.SWEEP_STORAGE_KEY, "path": contract.SWEEP_STORAGE_KEY}]
        assert contract.SWEEP_STORAGE_SECRET not in json.dumps(container.get("env", [])), "not in the environment"


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_only_a_pod_running_as_the_sweep_controller_may_carry_its_network_label(program, kind):
    """The label opens the API server to a pod (NetworkPolicies select labels, not ServiceAccounts): a controller's pod,
    as the CLI renders it, is admitted; the same label on a pod with any other identity is refused (issue 37, minor)."""
    import copy as copying
    prog, cfg = program
    team = cfg.teams[0].name
    from trainforge.trainer.spec import with_image
    controller = with_image(load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={
        "team": team, "sweep": {"controller": "s"}}), cfg)
    (pod,) = prog.pods(in_namespace(render(controller, decide(controller, cfg), kind), contract.namespace_name(team)))[:1]
    assert pod["metadata"]["labels"][contract.SWEEP_ROLE_LABEL] == contract.SWEEP_CONTROLLER_ROLE
    assert prog.denials(pod, PODS) == []
    as_trainer = copying.deepcopy(pod)
    as_trainer["spec"]["serviceAccountName"] = contract.TRAINING_SERVICE_ACCOUNT
    unnamed = copying.deepcopy(pod)
    del unnamed["spec"]["serviceAccountName"]
    (ordinary,) = prog.pods(in_namespace(rendered(cfg, team, kind=kind), contract.namespace_name(team)))[:1]
    labelled = copying.deepcopy(ordinary)
    labelled["metadata"]["labels"][contract.SWEEP_ROLE_LABEL] = contract.SWEEP_CONTROLLER_ROLE
    assert prog.denials(ordinary, PODS) == []
    for refused in (as_trainer, unnamed, labelled):
        assert [d for d in prog.denials(refused, PODS) if contract.SWEEP_ROLE_LABEL in d], refused["spec"].get("serviceAccountName")


# ---- the network: a team pod reaches no platform service but MLflow and DNS ---------------------------------------

PLATFORM_NAMESPACES = (contract.NAMESPACE_MLFLOW, contract.NAMESPACE_MONITORING, contract.NAMESPACE_OPENCOST, contract.NAMESPACE_SYSTEM,
                       contract.NAMESPACE_KUEUE, contract.NAMESPACE_TRAINER, "kube-system")


def _selects(selector: dict, labels: dict) -> bool:
    """A label selector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist), as the API server reads them."""
    operators = {"In": lambda key, values: key in labels and labels[key] in values, "NotIn": lambda key, values: labels.get(key) not in values,
                 "Exists": lambda key, _: key in labels, "DoesNotExist": lambda key, _: key not in labels}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) \
        and all(operators[e["operator"]](e["key"], e.get("values") or []) for e in selector.get("matchExpressions") or [])


def egress_allowed(policies: list[dict], source_namespace: str, dest: dict, source_labels: dict | None = None) -> bool:
    """NetworkPolicy egress from a pod of `source_namespace` with `source_labels` to `dest` (namespace, pod labels, an
    address, a port)."""
    import ipaddress
    selecting = [p for p in policies if "Egress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], source_labels or {})]
    if not selecting:
        return True

    def peer_admits(peer: dict) -> bool:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            address = ipaddress.ip_address(dest["ip"])
            return address in ipaddress.ip_network(block["cidr"]) and not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
        namespace_ok = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": dest["namespace"]}) if "namespaceSelector" in peer \
            else dest["namespace"] == source_namespace
        return namespace_ok and _selects(peer.get("podSelector") or {}, dest.get("labels") or {})

    for policy in selecting:
        for rule in policy["spec"].get("egress", []):
            peers_ok = "to" not in rule or any(peer_admits(peer) for peer in rule["to"])
            ports_ok = not rule.get("ports") or any(p.get("port") == dest["port"] for p in rule["ports"])
            if peers_ok and ports_ok:
                return True
    return False


def _workload_templates(obj: dict) -> list[dict]:
    spec = obj.get("spec") or {}
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return [spec["template"]]
    if obj["kind"] == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]]
    return [obj] if obj["kind"] == "Pod" else []


def platform_destinations(evaluation, cfg) -> list[dict]:
    """Every port a platform pod listens on, from the program's objects and the charts' rendered templates: container
    ports of every pod template, and every Service's ports (the operators' pods, Prometheus and Alertmanager, are
    reached through them). Each at an address inside the VPC, where pods live."""
    import ipaddress

    from support import helm
    rendered, _ = helm.rendered_program(evaluation)
    releases = helm.program_releases(evaluation)
    objects = [(manifest(r), None) for r in kubernetes_objects(evaluation)]
    objects += [(o, releases[name].get("namespace")) for name, objects_ in rendered.items() for o in objects_ if not helm.is_hook(o)]
    address = str(next(cfg.network.vpc_cidr.hosts()) + 1000)
    found = []
    for obj, release_namespace in objects:
        namespace = obj.get("metadata", {}).get("namespace") or release_namespace
        if namespace not in PLATFORM_NAMESPACES:
            continue
        if obj["kind"] == "Service":
            for port in obj["spec"].get("ports", []):
                # Before translation, at a ClusterIP (either range EKS may pick); after, at the pod's address and port.
                at = [(str(next(ipaddress.ip_network(c).hosts()) + 10), port["port"]) for c in contract.EKS_DEFAULT_SERVICE_CIDRS]
                at += [(address, number) for number in {port["port"], port.get("targetPort")} if isinstance(number, int)]
                for ip, number in at:
                    found.append({"namespace": namespace, "labels": obj["spec"].get("selector") or {}, "ip": ip, "port": number,
                                  "what": f"service {obj['metadata']['name']}"})
        for template in _workload_templates(obj):
            if template["spec"].get("hostNetwork"):
                continue  # on the node's address: inside the VPC, covered by the node ports below
            for container in template["spec"].get("containers", []):
                for port in container.get("ports", []):
                    found.append({"namespace": namespace, "labels": (template.get("metadata") or {}).get("labels") or {}, "ip": address,
                                  "port": port["containerPort"], "what": f"{obj['kind']} {obj['metadata']['name']}"})
    # The VPC's own: the nodes (kubelet, node exporter) and the API server's private endpoint.
    found += [{"namespace": "", "ip": address, "port": port, "what": what}
              for port, what in ((443, "the API server's private endpoint"), (10250, "a kubelet"), (9100, "a node exporter"))]
    return found


def test_a_team_pod_reaches_no_platform_service_but_mlflow_and_dns(stack):
    evaluation, cfg = stack
    destinations = platform_destinations(evaluation, cfg)
    assert len({d["namespace"] for d in destinations}) >= 5, "the charts' pods are there to check against"
    mlflow = [d for d in destinations if d["namespace"] == contract.NAMESPACE_MLFLOW and d["port"] == contract.MLFLOW_PORT]
    assert mlflow, "MLflow's own port is among the platform's"
    dns = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}, "ip": "10.0.0.10", "port": 53}
    for team in cfg.teams:
        namespace = contract.namespace_name(team.name)
        policies = [manifest(r) for r in kubernetes_objects(evaluation)
                    if r.type.endswith(":NetworkPolicy") and manifest(r)["metadata"]["namespace"] == namespace]
        reachable = [f"{d['what']} ({d['namespace'] or 'VPC'}:{d['port']})" for d in destinations
                     if egress_allowed(policies, namespace, d) and d not in mlflow]
        assert reachable == [], f"team {team.name} reaches {reachable}"
        assert all(egress_allowed(policies, namespace, d) for d in mlflow) and egress_allowed(policies, namespace, dns)
        assert egress_allowed(policies, namespace, {"namespace": "", "ip": "52.216.8.1", "port": 443}), "S3, STS: HTTPS out"
        assert egress_allowed(policies, namespace, {"namespace": namespace, "labels": {}, "ip": "10.0.9.9", "port": 29500}), \
            "its own ranks (rendezvous)"


def test_a_sweep_controller_reaches_the_api_server_and_nothing_else_a_team_pod_may_not(stack):
    """The controller's pods (and only pods labelled as one) may reach the API server: the `kubernetes` Service's
    address before translation, the VPC on 443 after (the endpoint's addresses are EKS's to choose). No other ClusterIP
    on 443, and no platform pod listens on 443, so after translation nothing else answers there."""
    import ipaddress
    evaluation, cfg = stack
    destinations = platform_destinations(evaluation, cfg)
    controller = {contract.SWEEP_ROLE_LABEL: contract.SWEEP_CONTROLLER_ROLE}
    services = [ipaddress.ip_network(c) for c in contract.EKS_DEFAULT_SERVICE_CIDRS]
    assert [d for d in destinations if d["port"] == 443 and not d["what"].startswith("service ") and "API server" not in d["what"]] == [], \
        "no platform container listens on 443"
    for team in cfg.teams:
        namespace = contract.namespace_name(team.name)
        policies = [manifest(r) for r in kubernetes_objects(evaluation)
                    if r.type.endswith(":NetworkPolicy") and manifest(r)["metadata"]["namespace"] == namespace]
        reachable = [d for d in destinations if egress_allowed(policies, namespace, d, controller)
                     and not (d["namespace"] == contract.NAMESPACE_MLFLOW and d["port"] == contract.MLFLOW_PORT)]
        assert any("API server" in d["what"] for d in reachable)
        assert all(d["port"] == 443 and not any(ipaddress.ip_address(d["ip"]) in r for r in services) for d in reachable), \
            [d for d in reachable if d["port"] != 443 or any(ipaddress.ip_address(d["ip"]) in r for r in services)]
        for service_range in services:
            kubernetes_service = {"namespace": "default", "labels": {}, "ip": str(service_range[1]), "port": 443}
            assert egress_allowed(policies, namespace, kubernetes_service, controller)
            assert not egress_allowed(policies, namespace, kubernetes_service), "an ordinary team pod does not"


def ingress_allowed(policies: list[dict], namespace: str, labels: dict, port: int, source_namespace: str | None,
                    source_labels: dict | None = None, source_ip: str | None = None) -> bool:
    """NetworkPolicy ingress into a pod of `namespace` with `labels` on `port`, from a pod of `source_namespace` with
    `source_labels` (None: any pod's labels would do) or, with no namespace, from `source_ip` (the API server's
    interfaces, a node)."""
    import ipaddress
    selecting = [p for p in policies if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], labels)]
    if not selecting:
        return True

    def peer_admits(peer: dict) -> bool:
        if "ipBlock" in peer:
            if source_ip is None:
                return False  # a pod's address is in the VPC too, but the callers here ask by selector
            block, address = peer["ipBlock"], ipaddress.ip_address(source_ip)
            return address in ipaddress.ip_network(block["cidr"]) and not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
        if source_namespace is None:
            return False
        pods_ok = source_labels is None and not (peer.get("podSelector") or {}).get("matchLabels") \
            or source_labels is not None and _selects(peer.get("podSelector") or {}, source_labels)
        if "namespaceSelector" in peer:
            return _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source_namespace}) and pods_ok
        return source_namespace == namespace and pods_ok
    return any(("from" not in rule or any(peer_admits(peer) for peer in rule["from"]))
               and (not rule.get("ports") or any(p.get("port") == port for p in rule["ports"]))
               for policy in selecting for rule in policy["spec"].get("ingress", []))


def _mlflow_pods(evaluation) -> dict[str, dict]:
    """Every pod template in MLflow's namespace, the chart's server and the program's Jobs, by what they are."""
    from support import helm
    rendered, _ = helm.rendered_program(evaluation)
    server = [o for o in rendered["mlflow"] if o["kind"] == "Deployment"]
    assert len(server) == 1
    pods = {"the server": server[0]["spec"]["template"]["metadata"]["labels"]}
    for obj in map(manifest, kubernetes_objects(evaluation)):
        if obj["kind"] == "Job" and obj["metadata"]["namespace"] == contract.NAMESPACE_MLFLOW:
            pods[f"Job {obj['metadata']['name']}"] = obj["spec"]["template"]["metadata"].get("labels") or {}
    return pods


def test_mlflow_reaches_only_dns_its_database_and_the_object_store(stack):
    """MLflow fetches what a user names (a model version's source, a gateway endpoint): its server may reach DNS, the
    stack's PostgreSQL and HTTPS outside the cluster, and no platform service (Prometheus, Alertmanager, the operators,
    the API server, a kubelet). The Jobs beside it reach the server and the database, not the internet."""
    from trainforge.platform.manifests import tracking
    evaluation, cfg = stack
    policies = [manifest(r) for r in kubernetes_objects(evaluation)
                if r.type.endswith(":NetworkPolicy") and manifest(r)["metadata"]["namespace"] == contract.NAMESPACE_MLFLOW]
    pods = _mlflow_pods(evaluation)
    assert tracking.SERVER_POD_LABELS.items() <= pods["the server"].items(), "the policies select the chart's server pods"
    assert len(pods) > 1 + len(cfg.teams), "the bootstrap, sweep and user Jobs are there to check"
    server_port = [d for d in platform_destinations(evaluation, cfg)
                   if d["namespace"] == contract.NAMESPACE_MLFLOW and d["port"] == contract.MLFLOW_PORT]
    others = [d for d in platform_destinations(evaluation, cfg) if d not in server_port]
    assert {"Prometheus", "Alertmanager"} <= {w for d in others for w in ("Prometheus", "Alertmanager") if w.lower() in d["what"].lower()}
    dns = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}, "ip": "10.0.0.10", "port": 53}
    database = {"namespace": "", "ip": str(next(cfg.network.vpc_cidr.hosts()) + 7), "port": contract.POSTGRES_PORT}
    s3 = {"namespace": "", "ip": "52.216.8.1", "port": 443}
    for what, labels in pods.items():
        reachable = [f"{d['what']} ({d['namespace'] or 'VPC'}:{d['port']})" for d in others
                     if egress_allowed(policies, contract.NAMESPACE_MLFLOW, d, labels)]
        assert reachable == [], f"{what} reaches {reachable}"
        assert egress_allowed(policies, contract.NAMESPACE_MLFLOW, dns, labels), what
        assert egress_allowed(policies, contract.NAMESPACE_MLFLOW, database, labels), what
        assert egress_allowed(policies, contract.NAMESPACE_MLFLOW, s3, labels) == (what == "the server"), what
        assert all(egress_allowed(policies, contract.NAMESPACE_MLFLOW, d, labels) for d in server_port), what
    for source in (contract.namespace_name(cfg.teams[0].name), contract.NAMESPACE_MLFLOW, "kube-system"):
        assert ingress_allowed(policies, contract.NAMESPACE_MLFLOW, pods["the server"], contract.MLFLOW_PORT, source), source
    assert not ingress_allowed(policies, contract.NAMESPACE_MLFLOW, pods["the server"], 8080, "kube-system")
    job = next(labels for what, labels in pods.items() if what.startswith("Job "))
    assert not ingress_allowed(policies, contract.NAMESPACE_MLFLOW, job, contract.MLFLOW_PORT, contract.NAMESPACE_MLFLOW)


def test_mlflows_jobs_and_server_start_after_the_namespaces_allowances(stack):
    """Default-deny applied alone would stop the bootstrap Jobs and the migration at their first connection."""
    from support.evaluated import RELEASE
    evaluation, _ = stack
    policies = [r for r in kubernetes_objects(evaluation)
                if r.type.endswith(":NetworkPolicy") and manifest(r)["metadata"]["namespace"] == contract.NAMESPACE_MLFLOW]
    assert len(policies) >= 5
    waiting = [r for r in kubernetes_objects(evaluation) if r.type.endswith(":Job") and manifest(r)["metadata"]["namespace"] == contract.NAMESPACE_MLFLOW]
    waiting += [r for r in evaluation.of_type(RELEASE) if r.inputs.get("namespace") == contract.NAMESPACE_MLFLOW]
    assert len(waiting) > 2
    for resource in waiting:
        assert all(evaluation.depends_on(resource, policy) for policy in policies), resource.name


# ---- the platform's other namespaces (platform/manifests/network.py) ------------------------------------------------

GOVERNED = (contract.NAMESPACE_KUEUE, contract.NAMESPACE_TRAINER, contract.NAMESPACE_MONITORING, contract.NAMESPACE_OPENCOST,
            contract.NAMESPACE_SYSTEM)
# The Prometheus operator makes these pods at run time, so no chart renders them: labelled at least as the Services in
# front of them select (network.PROMETHEUS_PODS, network.ALERTMANAGER_PODS are checked against those Services), with
# the operator's ports (prometheus-operator v0.93: http-web, and its config reloader's reloader-web).
OPERATOR_PODS = {"Prometheus": (9090, "http-web"), "Alertmanager": (9093, "http-web")}


class Platform:
    """The platform's pods, Services, monitors and webhooks, from the program's objects and the charts as rendered."""

    def __init__(self, evaluation):
        from support import helm
        rendered, _ = helm.rendered_program(evaluation)
        namespaces = {name: inputs.get("namespace") for name, inputs in helm.program_releases(evaluation).items()}
        self.objects = [manifest(r) for r in kubernetes_objects(evaluation)]
        for release, objects in rendered.items():
            for obj in objects:
                if not helm.is_hook(obj) or _workload_templates(obj):  # a hook Job's pod runs here too
                    self.objects.append({**obj, "metadata": {**obj["metadata"], "namespace": obj["metadata"].get("namespace") or namespaces[release]}})
        self.services = [o for o in self.objects if o["kind"] == "Service"]
        self.pods = [{"what": f"{o['kind']} {o['metadata']['name']}", "namespace": o["metadata"]["namespace"],
                      "labels": (t.get("metadata") or {}).get("labels") or {}, "hostNetwork": bool(t["spec"].get("hostNetwork")),
                      "ports": {p.get("name"): p["containerPort"] for c in t["spec"].get("containers", []) for p in c.get("ports", [])}}
                     for o in self.objects for t in _workload_templates(o)]
        for kind, (port, name) in OPERATOR_PODS.items():
            (service,) = [s for s in self.services if s["metadata"]["name"] == f"{contract.PROMETHEUS_RELEASE}-{kind.lower()}"]
            self.pods.append({"what": kind, "namespace": contract.NAMESPACE_MONITORING, "labels": dict(service["spec"]["selector"]),
                              "hostNetwork": False, "ports": {name: port, "reloader-web": 8080}})

    def policies(self, namespace: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == namespace]

    def pod(self, what: str) -> dict:
        (found,) = [p for p in self.pods if p["what"] == what]
        return found

    def behind(self, service: dict, port: int | str) -> list[tuple[dict, int]]:
        """The pods a Service's port leads to, each with the container port it reaches (a named targetPort resolved)."""
        (entry,) = [p for p in service["spec"]["ports"] if port in (p.get("name"), p["port"])]
        target = entry.get("targetPort", entry["port"])
        out = []
        for pod in self.pods:
            if pod["namespace"] == service["metadata"]["namespace"] and service["spec"].get("selector") \
                    and _selects({"matchLabels": service["spec"]["selector"]}, pod["labels"]):
                number = target if isinstance(target, int) else pod["ports"].get(target)
                assert number is not None, f"{pod['what']} has no port {target!r} for {service['metadata']['name']}"
                out.append((pod, number))
        return out

    def service(self, namespace: str, name: str) -> dict:
        (found,) = [s for s in self.services if s["metadata"]["namespace"] == namespace and s["metadata"]["name"] == name]
        return found

    def scrape_targets(self) -> list[tuple[str, dict | None, int]]:
        """(monitor, pod or None where the pod is no platform pod of ours, port) for every endpoint Prometheus scrapes."""
        out = []
        for monitor in (o for o in self.objects if o["kind"] in ("ServiceMonitor", "PodMonitor")):
            spec, name = monitor["spec"], f"{monitor['kind']} {monitor['metadata']['name']}"
            chosen = spec.get("namespaceSelector") or {}
            scope = None if chosen.get("any") else set(chosen.get("matchNames") or [monitor["metadata"]["namespace"]])

            def in_scope(namespace: str, scope: set[str] | None = scope) -> bool:
                return scope is None or namespace in scope
            if monitor["kind"] == "ServiceMonitor":
                services = [s for s in self.services if in_scope(s["metadata"]["namespace"])
                            and _selects(spec["selector"], s["metadata"].get("labels") or {})]
                for endpoint in spec["endpoints"]:
                    for service in services:
                        pods = self.behind(service, endpoint["port"]) if service["metadata"]["namespace"] in GOVERNED else []
                        out += [(name, pod, number) for pod, number in pods] or [(name, None, 0)]
            else:
                for endpoint in spec["podMetricsEndpoints"]:
                    pods = [p for p in self.pods if in_scope(p["namespace"]) and _selects(spec["selector"], p["labels"])]
                    out += [(name, pod, pod["ports"][endpoint["port"]]) for pod in pods] or [(name, None, 0)]
        return out


@pytest.fixture
def platform(stack):
    evaluation, cfg = stack
    return Platform(evaluation), cfg


def test_every_platform_namespace_denies_by_default(platform):
    cluster, _ = platform
    for namespace in (*GOVERNED, contract.NAMESPACE_MLFLOW):
        assert any(p["spec"]["podSelector"] == {} and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} and not p["spec"].get("ingress")
                   and not p["spec"].get("egress") for p in cluster.policies(namespace)), namespace


def test_every_call_the_api_server_makes_into_the_platform_is_admitted(platform):
    """Webhooks (Kueue's, the Trainer's, JobSet's, the Prometheus operator's; most fail closed), Kueue's visibility
    APIService and the service proxy `platform verify` uses reach their pods from the API server's interfaces, which
    EKS places in the VPC."""
    from trainforge.platform.plan import verify
    cluster, cfg = platform
    control_plane = str(next(cfg.network.vpc_cidr.hosts()) + 20)
    calls = []
    for configuration in (o for o in cluster.objects if o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")):
        for webhook in configuration["webhooks"]:
            target = webhook["clientConfig"]["service"]
            calls.append((f"webhook {webhook['name']}", target["namespace"], target["name"], target.get("port", 443)))
    for api in (o for o in cluster.objects if o["kind"] == "APIService" and o["spec"].get("service")):
        calls.append((f"APIService {api['metadata']['name']}", api["spec"]["service"]["namespace"], api["spec"]["service"]["name"],
                      api["spec"]["service"].get("port", 443)))
    proxied_namespace, proxied = verify.PROMETHEUS_SERVICE
    calls.append(("platform verify's service proxy", proxied_namespace, *proxied.split(":")[0:1], int(proxied.split(":")[1])))
    assert {namespace for _, namespace, _, _ in calls} >= {contract.NAMESPACE_KUEUE, contract.NAMESPACE_TRAINER, contract.NAMESPACE_MONITORING}
    refused = []
    for what, namespace, name, port in calls:
        pods = cluster.behind(cluster.service(namespace, name), port)
        assert pods or name == contract.PROMETHEUS_SERVICE_NAME, f"{what}: no pod behind {namespace}/{name}:{port}"
        refused += [f"{what} -> {pod['what']}:{number}" for pod, number in pods
                    if not ingress_allowed(cluster.policies(namespace), namespace, pod["labels"], number, None, source_ip=control_plane)]
    assert refused == []


def test_prometheus_scrapes_every_target_its_monitors_name(platform):
    """Every ServiceMonitor's and PodMonitor's endpoint, resolved to its pods and their ports: Prometheus may send
    (its own egress) and the pod may receive (its namespace's ingress). Targets outside the platform's namespaces
    (CoreDNS, the kubelets, the API server, the teams' ranks) are reached by address inside the cluster."""
    cluster, cfg = platform
    prometheus = cluster.pod("Prometheus")
    own = cluster.policies(contract.NAMESPACE_MONITORING)
    address = str(next(cfg.network.vpc_cidr.hosts()) + 30)
    targets = cluster.scrape_targets()
    assert {namespace for _, pod, _ in targets if pod for namespace in [pod["namespace"]]} >= {
        contract.NAMESPACE_MONITORING, contract.NAMESPACE_KUEUE, contract.NAMESPACE_OPENCOST, contract.NAMESPACE_SYSTEM}
    missed = []
    for monitor, pod, port in targets:
        if pod is None or pod["hostNetwork"]:
            continue
        if not egress_allowed(own, contract.NAMESPACE_MONITORING, {"namespace": pod["namespace"], "labels": pod["labels"], "ip": address, "port": port},
                              prometheus["labels"]):
            missed.append(f"{monitor}: Prometheus may not send to {pod['what']}:{port}")
        if not ingress_allowed(cluster.policies(pod["namespace"]), pod["namespace"], pod["labels"], port, contract.NAMESPACE_MONITORING, prometheus["labels"]):
            missed.append(f"{monitor}: {pod['what']} refuses Prometheus on {port}")
    for port, what in ((10250, "a kubelet"), (9100, "a node exporter"), (443, "the API server"), (9153, "CoreDNS"), (contract.METRICS_PORT, "a rank")):
        if not egress_allowed(own, contract.NAMESPACE_MONITORING, {"namespace": "", "ip": address, "port": port}, prometheus["labels"]):
            missed.append(f"Prometheus may not reach {what} on {port}")
    assert missed == []
    assert not egress_allowed(own, contract.NAMESPACE_MONITORING, {"namespace": "", "ip": "52.216.8.1", "port": 443}, prometheus["labels"]), \
        "Prometheus fetches nothing outside the cluster"


def reaches(cluster: Platform, source: dict, target: dict, port: int, ip: str = "10.0.9.9") -> bool:
    """Both ends agree: the source's namespace lets it send, the target's lets it receive."""
    return egress_allowed(cluster.policies(source["namespace"]), source["namespace"], {**target, "ip": ip, "port": port}, source["labels"]) \
        and ingress_allowed(cluster.policies(target["namespace"]), target["namespace"], target["labels"], port, source["namespace"], source["labels"])


def test_platform_pods_reach_what_they_use_and_only_two_reach_outside(platform):
    """Every platform pod resolves names and reaches the API server. Grafana reads Prometheus and Alertmanager,
    OpenCost reads Prometheus, the budget controller reads OpenCost. Only Alertmanager (its receivers) and OpenCost
    (AWS's price list) reach HTTPS outside the cluster; Grafana's data-source proxy and Prometheus do not."""
    from trainforge.platform.manifests import network
    cluster, cfg = platform
    dns = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}, "ip": "10.0.0.10", "port": 53}
    outside = {"namespace": "", "ip": "52.216.8.1", "port": 443}
    pods = [p for p in cluster.pods if p["namespace"] in GOVERNED and not p["hostNetwork"]]
    assert len({p["namespace"] for p in pods}) == len(GOVERNED)
    for pod in pods:
        policies = cluster.policies(pod["namespace"])
        assert egress_allowed(policies, pod["namespace"], dns, pod["labels"]), pod["what"]
        assert all(egress_allowed(policies, pod["namespace"], {"namespace": "", "ip": cidr.split("/")[0], "port": 443}, pod["labels"])
                   for cidr in tenancy_api_addresses(cfg)), pod["what"]
        goes_out = egress_allowed(policies, pod["namespace"], outside, pod["labels"])
        assert goes_out == (pod["what"] in ("Alertmanager", "Deployment opencost")), pod["what"]
    grafana, prometheus, alertmanager = cluster.pod("Deployment kube-prometheus-stack-grafana"), cluster.pod("Prometheus"), cluster.pod("Alertmanager")
    opencost, budget = cluster.pod("Deployment opencost"), cluster.pod(f"Deployment {contract.BUDGET_CONTROLLER}")
    assert reaches(cluster, grafana, prometheus, network.PROMETHEUS_PORT) and reaches(cluster, grafana, alertmanager, network.ALERTMANAGER_PORT)
    assert reaches(cluster, opencost, prometheus, network.PROMETHEUS_PORT)
    assert reaches(cluster, budget, opencost, contract.OPENCOST_API_PORT)
    assert not reaches(cluster, grafana, opencost, contract.OPENCOST_API_PORT) and not reaches(cluster, opencost, grafana, 3000)


def tenancy_api_addresses(cfg) -> list[str]:
    from trainforge.platform.manifests import tenancy
    return tenancy.api_server_addresses(cfg)


def test_egress_to_a_service_names_its_pods_by_the_services_own_selector(platform):
    """The VPC CNI's agent sees a Service's ClusterIP and admits it only when the Service's selector satisfies the
    rule's podSelector: a peer naming a key the Service does not select on would silently drop Grafana's and
    OpenCost's queries to Prometheus, and the budget controller's to OpenCost."""
    cluster, _ = platform
    peers = [(policy["metadata"]["namespace"], peer) for namespace in GOVERNED for policy in cluster.policies(namespace)
             for rule in policy["spec"].get("egress", []) for peer in rule.get("to", []) if (peer.get("podSelector") or {}).get("matchLabels")]
    assert len(peers) >= 4
    for namespace, peer in peers:
        target_namespace = next(iter(peer["namespaceSelector"]["matchLabels"].values())) if "namespaceSelector" in peer else namespace
        wanted = peer["podSelector"]["matchLabels"]
        fronting = [s for s in cluster.services if s["metadata"]["namespace"] == target_namespace
                    and wanted.items() <= (s["spec"].get("selector") or {}).items()]
        assert fronting or target_namespace == contract.NAMESPACE_KUBE_SYSTEM, f"no Service in {target_namespace} selects exactly by {wanted}"


def test_what_nobody_needs_is_closed(platform):
    """OpenCost's UI and MCP server, Grafana, the operators' metrics and the Trainer's status port: no team pod and no
    platform pod but Prometheus (scraping) may open them; the UIs are for `kubectl port-forward`."""
    cluster, cfg = platform
    team = {"namespace": contract.namespace_name(cfg.teams[0].name), "labels": {}}
    opencost, grafana = cluster.pod("Deployment opencost"), cluster.pod("Deployment kube-prometheus-stack-grafana")
    trainer = cluster.pod("Deployment kubeflow-trainer-controller-manager")
    budget = cluster.pod(f"Deployment {contract.BUDGET_CONTROLLER}")
    for target, port in ((opencost, 8081), (opencost, 9090), (grafana, 3000), (trainer, 10443), (trainer, 8443)):
        policies = cluster.policies(target["namespace"])
        for source in (team, budget, {"namespace": contract.NAMESPACE_MLFLOW, "labels": {}}):
            assert not ingress_allowed(policies, target["namespace"], target["labels"], port, source["namespace"], source["labels"]), \
                (target["what"], port, source["namespace"])
        assert not ingress_allowed(policies, target["namespace"], target["labels"], port, None, source_ip=str(next(cfg.network.vpc_cidr.hosts()) + 40))


def test_each_release_starts_after_its_namespaces_allowances(stack):
    """Default-deny alone would stop the charts' pods (the admission hook Jobs first) at their first connection."""
    from support.evaluated import RELEASE
    evaluation, _ = stack
    for namespace in (contract.NAMESPACE_KUEUE, contract.NAMESPACE_TRAINER, contract.NAMESPACE_MONITORING, contract.NAMESPACE_OPENCOST):
        policies = [r for r in kubernetes_objects(evaluation) if r.type.endswith(":NetworkPolicy") and manifest(r)["metadata"]["namespace"] == namespace]
        releases_here = [r for r in evaluation.of_type(RELEASE) if r.inputs.get("namespace") == namespace]
        assert policies and releases_here, namespace
        for release in releases_here:
            assert all(evaluation.depends_on(release, policy) for policy in policies), (namespace, release.name)
