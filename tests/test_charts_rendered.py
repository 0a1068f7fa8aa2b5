"""Every Helm release of every stack rendered through its real chart templates at the pinned version (tests/support/helm.py),
with the values the program really passes, and the rendered objects checked against the rest of the program: the
Prometheus it renders selects every monitor and rule, IRSA service accounts are the ones the pods run as and the roles
trust, no alert waits for a target EKS cannot have, every claim has a class, every pod has requests, and the GPU
DaemonSets land on every GPU node group the AWS layer creates."""

from __future__ import annotations

import fnmatch
import json
import re

import pytest
from support.helm import is_hook, program_releases, rendered_program

from trainforge import contract, k8s_schema, selectors
from trainforge.platform.plan.first_up import FirstUp, _plain, pod_templates, volume_claims

EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
MONITOR_KINDS = {"ServiceMonitor": "serviceMonitor", "PodMonitor": "podMonitor", "PrometheusRule": "rule"}
# What a managed control plane does not let Prometheus scrape (EKS runs it): alerts on these jobs fire for ever.
EKS_HIDDEN_JOBS = ("kube-controller-manager", "kube-scheduler", "kube-etcd", "kube-proxy")


@pytest.fixture
def rendered(stack):
    evaluation, cfg = stack
    objects, installs = rendered_program(evaluation)
    return evaluation, cfg, objects, installs


def everything(evaluation, objects) -> list[dict]:
    """What the API server receives on a first up: every release's objects and every object the program applies."""
    graph = FirstUp(evaluation, objects, {})
    return [o for r in graph.kubernetes_resources for o in graph.creates(r)]


def test_every_rendered_object_validates_for_the_stacks_kubernetes_version(rendered):
    import kubernetes_validate
    evaluation, cfg, objects, _ = rendered
    checked = 0
    for release, objs in objects.items():
        for obj in objs:
            if k8s_schema.has_schema(obj):  # the CRDs the platform pins (monitors, rules)
                assert k8s_schema.problems(obj) == [], (release, obj["kind"], obj["metadata"]["name"])
            elif "." not in obj["apiVersion"].split("/")[0] or obj["apiVersion"].split("/")[0].endswith(".k8s.io"):
                kubernetes_validate.validate(obj, f"{cfg.cluster.version}.0", strict=True)
            checked += 1
    assert checked > 200


def test_prometheus_selects_every_monitor_and_rule_of_the_platform(rendered):
    evaluation, _, objects, _ = rendered
    graph = FirstUp(evaluation, objects, {})
    (prometheus,) = [o for o in objects["kube-prometheus-stack"] if o["kind"] == "Prometheus"]
    spec = prometheus["spec"]
    monitors = [o for o in everything(evaluation, objects) if o["kind"] in MONITOR_KINDS]
    names = {o["metadata"]["name"] for o in monitors}
    assert {"kueue-controller-manager", "dcgm-exporter", "trainforge-trainers", "trainforge-training", "trainforge-budget"} <= names
    for monitor in monitors:
        field = MONITOR_KINDS[monitor["kind"]]
        namespace = graph.labels_of_namespace(monitor["metadata"]["namespace"])
        assert selectors.matches(spec.get(f"{field}Selector"), monitor["metadata"].get("labels")), \
            f"{monitor['kind']} {monitor['metadata']['name']} is not selected by the platform's Prometheus"
        assert selectors.matches(spec.get(f"{field}NamespaceSelector", {}), namespace), monitor["metadata"]["name"]


def test_kueues_monitor_scrapes_the_metrics_service_its_chart_renders(rendered):
    evaluation, _, objects, _ = rendered
    (monitor,) = [o for o in everything(evaluation, objects) if o["kind"] == "ServiceMonitor"
                  and o["metadata"]["namespace"] == contract.NAMESPACE_KUEUE]
    services = [s for s in objects["kueue"] if s["kind"] == "Service" and selectors.matches(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in services] == ["kueue-controller-manager-metrics-service"]
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in services[0]["spec"]["ports"]}


def test_no_alert_or_scrape_waits_for_a_target_eks_does_not_expose(rendered):
    evaluation, _, objects, _ = rendered
    for obj in everything(evaluation, objects):
        if obj["kind"] == "PrometheusRule":
            for group in obj["spec"]["groups"]:
                for rule in group["rules"]:
                    hidden = [j for j in EKS_HIDDEN_JOBS if re.search(rf'job="{j}"', rule["expr"])]
                    assert not hidden, f"{rule.get('alert') or rule.get('record')} in {obj['metadata']['name']} watches {hidden}"
        if obj["kind"] == "ServiceMonitor":
            assert not any(j in obj["metadata"]["name"] for j in EKS_HIDDEN_JOBS), obj["metadata"]["name"]


def test_every_platform_pod_requests_cpu_and_memory(rendered):
    evaluation, _, objects, _ = rendered
    missing = []
    created = everything(evaluation, objects)
    # What the API server fills in at admission: a LimitRange's defaultRequest in the pod's namespace.
    defaults = {o["metadata"]["namespace"]: {k: v for limit in o["spec"]["limits"] if limit["type"] == "Container"
                                             for k, v in (limit.get("defaultRequest") or {}).items()}
                for o in created if o["kind"] == "LimitRange"}
    for obj in created:
        if (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test":
            continue  # `helm test` pods, never run by an install
        for pod in pod_templates(obj):
            for container in [*(pod["spec"].get("initContainers") or []), *(pod["spec"].get("containers") or [])]:
                have = {**defaults.get(obj["metadata"].get("namespace"), {}), **((container.get("resources") or {}).get("requests") or {})}
                if not {"cpu", "memory"} <= set(have):
                    missing.append(f"{obj['kind']} {obj['metadata']['name']}/{container['name']}")
        if obj["kind"] in ("Prometheus", "Alertmanager"):  # the operator makes their pods from these
            if not {"cpu", "memory"} <= set((obj["spec"].get("resources") or {}).get("requests") or {}):
                missing.append(f"{obj['kind']} {obj['metadata']['name']}")
    assert missing == [], "no requests (the system nodes are small, the scheduler must know): " + ", ".join(missing)


def test_every_volume_claim_names_a_class_the_program_creates(rendered):
    evaluation, _, objects, _ = rendered
    classes = {o["metadata"]["name"] for o in everything(evaluation, objects) if o["kind"] == "StorageClass"}
    claims = [(o["kind"], claim) for o in everything(evaluation, objects) for claim in volume_claims(o) if not claim.get("volumeName")]
    assert ("Prometheus", claims[0][1]) in claims or any(k == "Prometheus" for k, _ in claims)
    for kind, claim in claims:
        assert claim.get("storageClassName") in classes, (kind, claim)


def test_irsa_service_accounts_are_the_ones_the_pods_run_as_and_the_roles_trust(rendered):
    evaluation, _, objects, _ = rendered
    roles = {r.state["arn"]: r for r in evaluation.of_type("aws:iam/role:Role")}
    seen = 0
    for release, objs in objects.items():
        accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs if o["kind"] == "ServiceAccount"}
        for obj in objs:
            for pod in pod_templates(obj):
                name = pod["spec"].get("serviceAccountName", "default")
                account = accounts.get((obj["metadata"]["namespace"], name))
                arn = ((account or {}).get("metadata", {}).get("annotations") or {}).get(contract.IRSA_ROLE_ANNOTATION)
                if arn is None:
                    continue
                trust = json.loads(roles[arn].inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
                assert f"system:serviceaccount:{obj['metadata']['namespace']}:{name}" in trust.values(), (release, name)
                seen += 1
        for (namespace, name), account in accounts.items():
            arn = (account["metadata"].get("annotations") or {}).get(contract.IRSA_ROLE_ANNOTATION)
            users = [p for o in objs for p in pod_templates(o) if p["spec"].get("serviceAccountName") == name]
            assert arn is None or users, f"{release}: {namespace}/{name} carries a role but no pod runs as it"
    assert seen >= 2  # the autoscaler and MLflow


def node_of(group, instance_type: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """A node of an EKS managed group as the scheduler sees it: the group's labels plus the kubelet's well-known ones."""
    labels = {**group.inputs.get("labels", {}), "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": instance_type, "eks.amazonaws.com/compute-type": "ec2"}
    taints = [{"key": t["key"], "value": t.get("value"), "effect": EFFECTS[t["effect"]]} for t in group.inputs.get("taints") or []]
    return labels, taints


def schedules_on(pod: dict, labels: dict[str, str], taints: list[dict[str, str]]) -> bool:
    spec = pod["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms and not any(selectors.matches({"matchExpressions": t.get("matchExpressions") or []}, labels) for t in terms):
        return False
    return all(any(t.get("operator") == "Exists" and t.get("key") in (None, taint["key"]) and t.get("effect") in (None, taint["effect"])
                   or t.get("key") == taint["key"] and t.get("value") == taint["value"] and t.get("effect") in (None, taint["effect"])
                   for t in spec.get("tolerations") or []) for taint in taints if taint["effect"] != "PreferNoSchedule")


@pytest.mark.parametrize("release, daemonset, groups", [
    ("nvidia-device-plugin", "nvidia-device-plugin", "gpu"),
    ("dcgm-exporter", "dcgm-exporter", "gpu"),
    ("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", "efa"),
])
def test_gpu_daemonsets_land_on_every_node_of_every_gpu_group_and_nowhere_else(rendered, release, daemonset, groups):
    evaluation, cfg, objects, _ = rendered
    if release not in objects:
        assert not any(g.efa for g in cfg.node_groups)
        return
    (ds,) = [o for o in objects[release] if o["kind"] == "DaemonSet" and o["metadata"]["name"] == daemonset]
    (pod,) = pod_templates(ds)
    gpu = {f.value for f in contract.GPU_FLAVOURS}
    for group in evaluation.of_type("aws:eks/nodeGroup:NodeGroup"):
        wanted = group.inputs["labels"][contract.LABEL_FLAVOUR] in gpu if groups == "gpu" else group.inputs["labels"].get(contract.LABEL_EFA) == "true"
        for instance_type in group.inputs["instanceTypes"]:
            assert schedules_on(pod, *node_of(group, instance_type)) == wanted, (group.name, instance_type)


def test_the_releases_rendered_are_the_programs(rendered):
    """The values under test are what the engine recorded for each release, not a copy."""
    evaluation, _, objects, _ = rendered
    assert set(objects) == set(program_releases(evaluation))
    assert all(_plain(r.inputs)["name"] in objects for r in evaluation.of_type("kubernetes:helm.sh/v3:Release"))
    assert not any(is_hook(o) for o in objects["kueue"])


def test_mlflow_writes_artifacts_where_its_role_may(rendered):
    """Issue 23: the chart's artifact path and the IRSA policy's prefix were two spellings of one fact (contract
    .MLFLOW_ARTIFACT_PATH now): the server's rendered artifacts destination lies under what its role may write."""
    evaluation, _, objects, _ = rendered
    text = json.dumps(objects["mlflow"])
    destinations = set(re.findall(r"s3://([^/\"\s]+)/([^\"\s]*)", text))
    assert destinations, "the rendered server names its artifacts destination"
    policies = [json.loads(r.inputs["policy"]) for r in evaluation.of_type("aws:iam/rolePolicy:RolePolicy") if "artifacts" in r.name]
    writable = [s["Resource"] for p in policies for s in p["Statement"] if "s3:PutObject" in s.get("Action", [])]
    assert writable
    keys = [pattern.split("/", 1)[1] for pattern in writable if "/" in pattern]  # the mock engine names buckets its own way
    for _, path in destinations:
        key = f"{path.rstrip('/')}/run-1/artifacts/model.pkl"
        assert any(fnmatch.fnmatch(key, pattern) for pattern in keys), (key, writable)


def test_no_platform_component_but_the_operators_reads_every_namespaces_secrets(rendered):
    """Issue 37 (minor): Grafana's sidecar reads ConfigMaps and Secrets in the monitoring namespace only (a Role), not in
    every team's namespace; the cluster-wide Secret readers left are the charts' operators and controllers."""
    _, _, objects, _ = rendered

    def reads_secrets(role: dict) -> bool:
        return any(rule.get("apiGroups", [""]) in ([""], ["*"]) and set(rule.get("resources", [])) & {"secrets", "*"}
                   and set(rule.get("verbs", [])) & {"get", "list", "watch", "*"} for rule in role.get("rules") or [])
    grafana = [o for o in objects["kube-prometheus-stack"] if o["kind"] in ("ClusterRole", "Role") and "grafana" in o["metadata"]["name"]]
    assert grafana, "Grafana's RBAC is rendered"
    assert not [o["metadata"]["name"] for o in grafana if o["kind"] == "ClusterRole" and reads_secrets(o)]
    assert any(o["kind"] == "Role" and reads_secrets(o) for o in grafana), "its sidecar still reads its own namespace"
    # ... and looks there only: a sidecar told to search ALL namespaces with a Role is refused, and loads no dashboard.
    (deployment,) = [o for o in objects["kube-prometheus-stack"] if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-grafana")]
    sidecars = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"].startswith("grafana-sc-")]
    assert sidecars
    for sidecar in sidecars:
        searched = {e["name"]: e.get("value") for e in sidecar.get("env", [])}.get("NAMESPACE")
        assert searched in (None, deployment["metadata"].get("namespace", "monitoring")), (sidecar["name"], searched)
