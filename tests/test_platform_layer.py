"""The Kubernetes layer under the mock engine, for every stack: every object it applies is valid for the cluster it
lands on, every chart is pinned and configured with keys the chart has, and the pieces agree with each other and
with the AWS layer (flavours and node groups, Prometheus' selector and our labels, IRSA roles and service accounts)."""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest
import yaml
from support import helm
from support.repo import REPO

from trainforge import contract, k8s_schema, versions
from trainforge.platform.manifests import monitoring
from trainforge.stackconfig import CONFIG_KEY, ConfigError, parse, read_stack_file
from support.evaluated import RELEASE, is_secret, kubernetes_objects, manifest, releases

CORE_TYPES = {"kubernetes:core/v1:Namespace", "kubernetes:core/v1:ConfigMap", "kubernetes:core/v1:Secret",
              "kubernetes:core/v1:PersistentVolume", "kubernetes:storage.k8s.io/v1:StorageClass",
              # tenancy's
              "kubernetes:core/v1:PersistentVolumeClaim", "kubernetes:core/v1:ResourceQuota", "kubernetes:core/v1:LimitRange",
              "kubernetes:core/v1:ServiceAccount", "kubernetes:rbac.authorization.k8s.io/v1:Role",
              "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "kubernetes:networking.k8s.io/v1:NetworkPolicy",
              # the budget controller's
              "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
              "kubernetes:apps/v1:Deployment",
              # each team's sweep database
              "kubernetes:batch/v1:Job",
              # the guardrails over team namespaces
              "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
              "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
              # the Trainer's and JobSet's CRDs, applied by the program (platform/manifests/crds.py)
              "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinitionPatch"}


# ---- every object valid where it lands ------------------------------------------------------------------------

def test_every_core_object_validates_strictly_for_the_stacks_kubernetes_version(stack):
    import kubernetes_validate
    evaluation, cfg = stack
    core = [r for r in kubernetes_objects(evaluation) if r.type in CORE_TYPES]
    assert {r.type for r in core} == CORE_TYPES
    for resource in core:
        kubernetes_validate.validate(manifest(resource), f"{cfg.cluster.version}.0", strict=True)


def test_every_custom_resource_validates_against_its_pinned_crd(stack):
    evaluation, _ = stack
    custom = [r for r in kubernetes_objects(evaluation) if r.type not in CORE_TYPES]
    kinds = {manifest(r)["kind"] for r in custom}
    assert kinds == {"ResourceFlavor", "Cohort", "WorkloadPriorityClass", "ClusterTrainingRuntime", "PodMonitor", "PrometheusRule", "ServiceMonitor",
                     "ClusterQueue", "LocalQueue"}  # the last two: tenancy
    for resource in custom:
        assert k8s_schema.problems(manifest(resource)) == [], resource.name


def test_the_strict_checks_catch_a_misspelt_field():
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "x"}, "spec": {"nodeLabel": {}}}
    assert any("nodeLabel" in p for p in k8s_schema.problems(flavor))


# ---- charts: pinned, and configured with keys they have --------------------------------------------------------

def default_values(release: dict) -> dict:
    """The pinned chart's defaults, from its vendored source (tests/data/charts), subcharts' under their names."""
    return helm.default_values({"chart": release.get("chart", release["name"]), **release})


# Maps a chart documents as free-form though its default is not empty (each key is passed on as it is).
FREE_FORM = {"extraArgs"}  # cluster-autoscaler: every key becomes a `--key=value` flag of the autoscaler


def unknown_key_paths(ours, theirs, prefix="") -> list[str]:
    """Key paths we set that the chart's defaults lack. A map the chart leaves empty ({} or null) is free-form."""
    if not isinstance(ours, dict):
        return []
    out = []
    for key, value in ours.items():
        path = f"{prefix}.{key}" if prefix else key
        if not isinstance(theirs, dict) or key not in theirs:
            out.append(path)
        elif isinstance(theirs[key], dict) and theirs[key] and path not in FREE_FORM:
            out += unknown_key_paths(value, theirs[key], path)
    return out


merged = helm.merged


def test_every_chart_is_pinned_exactly_from_the_one_table(stack):
    from trainforge.platform.manifests.charts import CHARTS
    evaluation, cfg = stack
    found = releases(evaluation)
    expected = {n for n in CHARTS if n != "aws-efa-k8s-device-plugin" or any(g.efa for g in cfg.node_groups)}
    assert set(found) == expected
    for name, release in found.items():
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", release["version"]), name
        assert release["version"] == CHARTS[name].version and release["namespace"] == CHARTS[name].namespace
    assert found["kubeflow-trainer"]["version"] == versions.KUBEFLOW_TRAINER and found["kueue"]["version"] == versions.KUEUE
    assert versions.kueue_manages(found["kueue"]["version"], found["kubeflow-trainer"]["version"])


def test_every_values_key_exists_in_the_charts_defaults(stack):
    evaluation, _ = stack
    for name, release in releases(evaluation).items():
        assert unknown_key_paths(release["values"], default_values(release)) == [], name


def test_a_misspelt_values_key_is_caught():
    assert unknown_key_paths({"prometheus": {"prometheusSpec": {"retension": "15d"}}},
                             default_values({"name": "kube-prometheus-stack", "version": "88.5.3"})) == ["prometheus.prometheusSpec.retension"]


def test_the_mlflow_values_validate_against_the_charts_schema(stack):
    evaluation, _ = stack
    release = releases(evaluation)["mlflow"]
    schema = helm.values_schema(release)
    jsonschema.validate(merged(default_values(release), release["values"]), schema)
    broken = copy.deepcopy(release["values"])
    broken["backendStore"]["postgres"]["hostname"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="hostname"):
        jsonschema.validate(merged(default_values(release), broken), schema)


def test_kueue_keeps_the_charts_configuration_and_adds_trainforges(stack):
    evaluation, cfg = stack
    ours = yaml.safe_load(releases(evaluation)["kueue"]["values"]["managerConfig"]["controllerManagerConfigYaml"])
    chart = yaml.safe_load(default_values({"name": "kueue", "version": versions.KUEUE})["managerConfig"]["controllerManagerConfigYaml"])
    assert set(chart) - {"integrations"} <= set(ours), "a chart default dropped from the Configuration"
    assert ours["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert "trainer.kubeflow.org/trainjob" in ours["integrations"]["frameworks"]
    assert ("kubeflow.org/pytorchjob" in ours["integrations"]["frameworks"]) == cfg.kubernetes.training_operator
    from trainforge.stackconfig.kubernetes import duration_seconds
    assert duration_seconds(ours["waitForPodsReady"]["timeout"]) >= 15 * 60, "longer than a GPU group's scale-from-zero"


def test_the_v1_operator_is_a_stack_option():
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["kubernetes"] = {"training_operator": True}
    from trainforge.platform.components.offline import evaluate
    evaluation = evaluate({CONFIG_KEY: raw}, "dev")
    (operator,) = evaluation.of_type("kubernetes:kustomize/v2:Directory")
    assert operator.inputs["directory"].endswith(f"?ref=v{versions.TRAINING_OPERATOR}")
    frameworks = yaml.safe_load(releases(evaluation)["kueue"]["values"]["managerConfig"]["controllerManagerConfigYaml"])["integrations"]["frameworks"]
    assert "kubeflow.org/pytorchjob" in frameworks


# ---- where each add-on runs, and as whom -----------------------------------------------------------------------

def tolerated(tolerations: list[dict], taint: contract.Taint) -> bool:
    return any(t.get("key") in (None, taint.key) and (t.get("operator") == "Exists" or t.get("value") == taint.value)
               and t.get("effect") in (None, taint.effect) for t in tolerations)


def test_gpu_addons_tolerate_every_gpu_nodes_taints_and_land_only_on_gpu_nodes(stack):
    evaluation, cfg = stack
    found = releases(evaluation)
    for name in ("nvidia-device-plugin", "dcgm-exporter"):
        chart_values = found[name]["values"]
        for flavour in contract.GPU_FLAVOURS:
            assert all(tolerated(chart_values["tolerations"], t) for t in contract.flavour_traits(flavour).taints), (name, flavour)
        terms = chart_values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [f.value for f in contract.GPU_FLAVOURS]
    if any(g.efa for g in cfg.node_groups):
        efa = found["aws-efa-k8s-device-plugin"]["values"]
        assert efa["nodeSelector"] == {contract.LABEL_EFA: "true"}
        ours = {t for g in cfg.node_groups if g.efa for t in g.instance_types}
        assert ours <= set(efa["supportedInstanceLabels"]["values"])
        chart_allowlist = set(default_values(found["aws-efa-k8s-device-plugin"])["supportedInstanceLabels"]["values"])
        assert ours <= chart_allowlist, "the pinned chart must know the stack's EFA types"


def test_service_accounts_carry_their_irsa_roles_scoped_to_this_stack(stack):
    evaluation, cfg = stack
    found = releases(evaluation)
    roles = {r.state["arn"]: r for r in evaluation.of_type("aws:iam/role:Role")}
    autoscaler_arn = found["cluster-autoscaler"]["values"]["rbac"]["serviceAccount"]["annotations"][contract.IRSA_ROLE_ANNOTATION]
    mlflow_arn = found["mlflow"]["values"]["serviceAccount"]["annotations"][contract.IRSA_ROLE_ANNOTATION]
    for arn, namespace, account in ((autoscaler_arn, contract.NAMESPACE_AUTOSCALER, contract.AUTOSCALER_SERVICE_ACCOUNT),
                                    (mlflow_arn, contract.NAMESPACE_MLFLOW, contract.MLFLOW_SERVICE_ACCOUNT)):
        trust = json.loads(roles[arn].inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
        assert f"system:serviceaccount:{namespace}:{account}" in trust.values()
    assert found["cluster-autoscaler"]["values"]["rbac"]["serviceAccount"]["name"] == contract.AUTOSCALER_SERVICE_ACCOUNT
    policy = next(json.loads(p.inputs["policy"]) for p in evaluation.of_type("aws:iam/rolePolicy:RolePolicy")
                  if p.inputs["role"] == roles[autoscaler_arn].id)
    resize = next(s for s in policy["Statement"] if s["Sid"] == "ResizeOwnGroups")
    asgs = {ng.state["resources"][0]["autoscalingGroups"][0]["name"] for ng in evaluation.of_type("aws:eks/nodeGroup:NodeGroup")}
    assert {arn.rsplit("/", 1)[-1] for arn in resize["Resource"]} == asgs
    assert resize["Condition"]["StringEquals"] == {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cfg.cluster_name}": "owned"}
    assert found["cluster-autoscaler"]["values"]["autoDiscovery"]["clusterName"] == cfg.cluster_name


# ---- flavours agree with node groups ---------------------------------------------------------------------------

def test_every_resource_flavour_matches_the_nodes_of_its_groups(stack):
    """Over the evaluated stack: a node of each group carries its flavour's labels, and its taints are exactly the
    flavour's (which the rendered jobs tolerate)."""
    evaluation, cfg = stack
    flavours = {manifest(r)["metadata"]["name"]: manifest(r)["spec"] for r in kubernetes_objects(evaluation) if r.type.endswith(":ResourceFlavor")}
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    # The system nodes are no flavour: no team is ever admitted there.
    assert set(flavours) == {g.flavour.value for g in cfg.node_groups} - {contract.Flavour.SYSTEM.value}
    for group in evaluation.of_type("aws:eks/nodeGroup:NodeGroup"):
        labels = group.inputs["labels"]
        if labels[contract.LABEL_FLAVOUR] == contract.Flavour.SYSTEM.value:
            continue
        flavour = flavours[labels[contract.LABEL_FLAVOUR]]
        assert all(labels.get(k) == v for k, v in flavour["nodeLabels"].items())
        node_taints = sorted((t["key"], t["value"], effects[t["effect"]]) for t in group.inputs.get("taints") or [])
        assert sorted((t["key"], t["value"], t["effect"]) for t in flavour.get("nodeTaints", [])) == node_taints


# ---- monitoring ------------------------------------------------------------------------------------------------

def test_prometheus_selects_our_monitors_and_rules(stack):
    evaluation, _ = stack
    release = releases(evaluation)["kube-prometheus-stack"]
    spec = release["values"]["prometheus"]["prometheusSpec"]
    assert spec["podMonitorSelectorNilUsesHelmValues"] and spec["ruleSelectorNilUsesHelmValues"]
    for r in kubernetes_objects(evaluation):
        obj = manifest(r)
        if obj["kind"] in ("PodMonitor", "PrometheusRule"):
            assert obj["metadata"]["labels"]["release"] == release["name"], obj["kind"]
    assert releases(evaluation)["dcgm-exporter"]["values"]["serviceMonitor"]["additionalLabels"]["release"] == release["name"]
    assert releases(evaluation)["opencost"]["values"]["opencost"]["metrics"]["serviceMonitor"]["additionalLabels"]["release"] == release["name"]
    (monitor,) = [manifest(r) for r in kubernetes_objects(evaluation) if r.type.endswith(":PodMonitor")
                  and manifest(r)["metadata"]["name"] == monitoring.TRAINER_PODMONITOR]
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is False  # a pod's labels never beat Kubernetes'
    assert monitor["spec"]["sampleLimit"] and monitor["spec"]["labelLimit"]  # (tests/test_scrape_labels.py: in Prometheus)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == contract.METRICS_PORT_NAME


def test_the_dcgm_exporter_waits_for_the_prometheus_operators_crds(stack):
    evaluation, _ = stack
    by_name = {r.inputs["name"]: r for r in evaluation.of_type(RELEASE)}
    assert evaluation.depends_on(by_name["dcgm-exporter"], by_name["kube-prometheus-stack"])
    for r in kubernetes_objects(evaluation):
        if manifest(r)["kind"] in ("ResourceFlavor", "Cohort", "WorkloadPriorityClass"):
            assert evaluation.depends_on(r, by_name["kueue"])
        if manifest(r)["kind"] == "ClusterTrainingRuntime":
            assert evaluation.depends_on(r, by_name["kubeflow-trainer"])


def test_every_metric_the_rules_and_dashboard_query_is_exported():
    from prometheus_client import CollectorRegistry

    from trainforge.platform.manifests import monitoring
    from trainforge.stackconfig import MonitoringConfig
    from trainforge.trainer.controllers.budget import PrometheusMetrics
    from trainforge.trainer.runtime.metrics import RuntimeMetrics
    registry = CollectorRegistry()
    RuntimeMetrics(job="j", team="t", rank=0, registry=registry)
    PrometheusMetrics(registry)  # the budget controller's
    exported = {s.name for family in registry.collect() for s in family.samples} | {f.name for f in registry.collect()}
    queried = set()
    for expr in monitoring.queried_expressions(MonitoringConfig()):
        queried |= set(re.findall(r"\b(trainforge_[a-z_]+|kueue_[a-z_]+|DCGM_[A-Z_]+)\b", expr))
    ours = {m for m in queried if m.startswith("trainforge_")}
    assert ours and ours <= exported, f"not exported by the runtime or the budget controller: {sorted(ours - exported)}"
    assert queried - ours <= set(monitoring.EXTERNAL_METRICS)


# ---- the MLflow database ---------------------------------------------------------------------------------------

def test_the_mlflow_database_is_encrypted_private_reachable_only_from_nodes_with_a_secret_password(stack):
    evaluation, cfg = stack
    (db,) = evaluation.of_type("aws:rds/instance:Instance")
    (key,) = [k for k in evaluation.of_type("aws:kms/key:Key") if k.name.endswith("-data")]
    assert db.inputs["storageEncrypted"] is True and db.inputs["kmsKeyId"] == key.state["arn"]
    assert db.inputs["publiclyAccessible"] is False and db.inputs["backupRetentionPeriod"] >= 1
    assert is_secret(db.inputs["password"]), "the password must stay a secret in the state"
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    groups = {g.id: g for g in evaluation.of_type("aws:ec2/securityGroup:SecurityGroup")}
    (sg,) = [groups[i] for i in db.inputs["vpcSecurityGroupIds"]]
    assert [(r["fromPort"], r["toPort"], r["securityGroups"]) for r in sg.inputs["ingress"]] == \
        [(5432, 5432, [cluster.state["vpcConfig"]["clusterSecurityGroupId"]])]
    assert not any(r.get("cidrBlocks") for r in sg.inputs["ingress"])
    (secret,) = [r for r in evaluation.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["name"] == "mlflow-database"]
    data = secret.inputs["data"]
    assert is_secret(data) or is_secret(data["password"]), "the Kubernetes Secret's data stays a secret in the state"
    for other in evaluation.of_type("kubernetes:core/v1:Secret"):  # the teams' sweep database credentials too
        values = other.inputs.get("data") or other.inputs.get("stringData")
        assert is_secret(values) or all(is_secret(v) for v in values.values()), other.name
    # MLflow signs in as its own role; the master user's Secret reaches only the bootstrap Jobs (tests/test_databases.py).
    from trainforge.platform.manifests import tracking
    mlflow = releases(evaluation)["mlflow"]["values"]
    assert mlflow["backendStore"]["existingDatabaseSecret"]["name"] == mlflow["auth"]["postgres"]["existingSecret"]["name"] == tracking.SERVER_SECRET
    (server,) = [r for r in evaluation.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["name"] == tracking.SERVER_SECRET]
    assert manifest(server)["stringData"]["username"] == tracking.SERVER_ROLE
    master = manifest(secret)["metadata"]["name"]
    users = [manifest(r) for r in evaluation.of_type("kubernetes:batch/v1:Job")
             if master in json.dumps(r.inputs.get("spec", {}))]
    assert users and all(j["metadata"]["namespace"] == contract.NAMESPACE_MLFLOW and
                         j["spec"]["template"]["spec"]["containers"][0]["image"] == "public.ecr.aws/docker/library/postgres:16-alpine"
                         for j in users), "only the psql bootstrap Jobs hold the master user's credentials"
    assert master not in json.dumps(mlflow)
    assert "password" not in json.dumps(mlflow["backendStore"]["postgres"]), "the chart gets the password only from the Secret"
    assert mlflow["artifactRoot"]["proxiedArtifactStorage"] is True


# ---- the contract and the config -------------------------------------------------------------------------------

def test_the_stack_outputs_carry_the_kubernetes_side_of_the_contract(stack):
    evaluation, _ = stack
    out = evaluation.outputs["kubernetes"]
    assert out["mlflow_tracking_uri"] == contract.MLFLOW_TRACKING_URI
    assert out["training_runtimes"] == [contract.CLUSTER_TRAINING_RUNTIME, contract.CLUSTER_TRAINING_RUNTIME_SPOT]
    assert out["charts"]["kueue"] == versions.KUEUE and out["namespaces"]["monitoring"] == contract.NAMESPACE_MONITORING


@pytest.mark.parametrize("section, message", [
    ({"charts": {"kueue": "0.20.0"}}, "Trainer and Kueue move together"),
    ({"charts": {"mlflow": "^1.11"}}, "exact version"),
    ({"kueue": {"wait_for_pods_ready_timeout": "5m"}}, "scale-from-zero"),
    ({"monitoring": {"retention_days": 0}}, "kubernetes.monitoring.retention_days"),
    ({"mlfow": {}}, "kubernetes.mlfow"),
])
def test_bad_kubernetes_settings_are_rejected_naming_the_field(section, message):
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["kubernetes"] = section
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(raw, environment="dev", source="dev")


def test_a_stack_may_repin_a_chart():
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["kubernetes"] = {"charts": {"nvidia-device-plugin": "0.19.0"}}
    from trainforge.platform.components.offline import evaluate
    assert releases(evaluate({CONFIG_KEY: raw}, "dev"))["nvidia-device-plugin"]["version"] == "0.19.0"
