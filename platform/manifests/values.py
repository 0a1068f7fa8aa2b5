"""Helm values for every chart, built from the typed stack config and the contract (no string templates).

Each builder sets only keys that exist in the pinned chart's default values (tests/test_platform_layer.py checks
every key path against `tests/data/helm/`): Helm silently ignores a misspelt key.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from trainforge import contract, durations, versions
from trainforge.contract import Flavour
from trainforge.platform.manifests import monitoring, network, storage, tracking
from trainforge.stackconfig import PlatformConfig

CRITICAL_ADDONS = {"key": "CriticalAddonsOnly", "operator": "Exists"}
# Device plugins and exporters run on GPU nodes, which are tainted (GPU; spot on spot groups): tolerate both.
GPU_NODE_TOLERATIONS = [
    CRITICAL_ADDONS,
    {"key": contract.TAINT_GPU, "operator": "Exists", "effect": "NoSchedule"},
    {"key": contract.TAINT_SPOT, "operator": "Exists", "effect": "NoSchedule"},
]
# Cluster services (controllers, Prometheus, MLflow) run on the untainted system nodes.
SYSTEM_NODES = {contract.LABEL_FLAVOUR: Flavour.SYSTEM.value}


def requests(cpu: str, memory: str, memory_limit: str | None = None) -> dict[str, Any]:
    """A container's requests (the system nodes are small: the scheduler must know what each add-on takes) and, where
    a leak would take the node down with it, a memory limit."""
    out: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if memory_limit:
        out["limits"] = {"memory": memory_limit}
    return out


# The regional registry of EKS add-on images (AWS docs, "View Amazon container image registries for Amazon EKS add-ons"):
# account 602401143452 in most regions, its own account in the opt-in regions listed here. Pulling from another
# region's registry costs cross-region transfer on every node start and fails when that region is impaired.
EKS_ADDON_REGISTRY_ACCOUNTS = {"af-south-1": "877085696533", "ap-east-1": "800184023465", "me-south-1": "558608220178",
                               "eu-south-1": "590381155156"}


def eks_addon_image(region: str, repository: str) -> str:
    account = EKS_ADDON_REGISTRY_ACCOUNTS.get(region, "602401143452")
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{repository}"


def gpu_node_affinity() -> dict[str, Any]:
    """Nodes of a GPU flavour (the flavour label the AWS layer puts on every node): the NVIDIA plugin's default
    affinity wants NFD labels that EKS nodes do not have, so it would schedule nowhere; on CPU nodes it crash-loops."""
    gpu = [f.value for f in contract.GPU_FLAVOURS]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": contract.LABEL_FLAVOUR, "operator": "In", "values": gpu}]}]}}}


def nvidia_device_plugin(cfg: PlatformConfig) -> dict[str, Any]:
    return {"tolerations": GPU_NODE_TOLERATIONS, "affinity": gpu_node_affinity(), "gfd": {"enabled": False},
            "resources": requests("10m", "32Mi", "128Mi")}


def dcgm_exporter(cfg: PlatformConfig) -> dict[str, Any]:
    return {
        "tolerations": GPU_NODE_TOLERATIONS, "affinity": gpu_node_affinity(),
        # The chart's ServiceMonitor, selected by kube-prometheus-stack's Prometheus through its release label. Scraped
        # labels never win (honorLabels false): the GPU's pod and namespace arrive as exported_*, and the relabelings
        # make them the series' own, with `team` from the namespace (monitoring.dcgm_metric_relabelings). The scrape is
        # bounded by Prometheus's enforced limits (the chart's ServiceMonitor has no limit of its own).
        "serviceMonitor": {"enabled": True, "interval": "15s", "honorLabels": False, "additionalLabels": {"release": contract.PROMETHEUS_RELEASE},
                           "metricRelabelings": monitoring.dcgm_metric_relabelings()},
        # GPU series carry the training job's name and node index, and no other pod label: an unbounded set of labels
        # any member can set would be copied onto every GPU series.
        "kubernetes": {"enablePodLabels": True,
                       "podLabelAllowlistRegex": [f"^{re.escape(label)}$" for label in monitoring.DCGM_POD_LABELS]},
    }


def efa_device_plugin(cfg: PlatformConfig) -> dict[str, Any]:
    """On EFA groups only; the instance allowlist is the stack's EFA types (a chart whose list lacks one runs nowhere
    there, and NCCL silently falls back to TCP)."""
    types = sorted({t for g in cfg.node_groups if g.efa for t in g.instance_types})
    return {
        "tolerations": GPU_NODE_TOLERATIONS,
        "nodeSelector": {contract.LABEL_EFA: "true"},
        "image": {"repository": eks_addon_image(cfg.region, "eks/aws-efa-k8s-device-plugin")},
        "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"], "values": types},
    }


def kubeflow_trainer(cfg: PlatformConfig) -> dict[str, Any]:
    # JobSet comes with the chart; the chart's own runtimes stay off: trainforge applies its ClusterTrainingRuntimes
    # as typed resources (platform/training/runtime.py).
    return {"jobset": {"install": True}, "runtimes": {"defaultEnabled": False},
            "manager": {"nodeSelector": SYSTEM_NODES, "config": {"certManagement": {"enable": True}},
                        "resources": requests("100m", "256Mi", "1Gi")}}


def kueue_configuration(cfg: PlatformConfig) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): the chart's defaults kept, trainforge's choices added."""
    frameworks = ["batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]
    if cfg.kubernetes.training_operator:
        frameworks.append("kubeflow.org/pytorchjob")  # commented out of the chart's defaults since 0.19
    out: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},  # quota and usage per ClusterQueue
        "webhook": {"port": network.WEBHOOK_PORT},  # what the control plane may reach (network policies)
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {"groupKindConcurrency": {"Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10, "LocalQueue.kueue.x-k8s.io": 5,
                                                "ClusterQueue.kueue.x-k8s.io": 5, "ResourceFlavor.kueue.x-k8s.io": 1}},
        "clientConnection": {"qps": 300, "burst": 500},
        # A job admitted but not running within the timeout (GPU nodes scaling from zero) is requeued, not stuck; one
        # that lost a pod (a spot node reclaimed) gets recoveryTimeout for its replacement node, a GPU scale-up.
        "waitForPodsReady": {"timeout": durations.go(durations.seconds(cfg.kubernetes.kueue.wait_for_pods_ready_timeout)),
                             "recoveryTimeout": durations.go(durations.seconds(cfg.kubernetes.kueue.recovery_timeout)),
                             "blockAdmission": False,
                             "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": 5, "backoffBaseSeconds": 60,
                                                   "backoffMaxSeconds": 3600}},
        "integrations": {"frameworks": frameworks},
        "resources": {"excludeResourcePrefixes": list(contract.KUEUE_EXCLUDED_RESOURCES)},
        # Kueue manages the team namespaces only (the chart's Job webhooks follow this selector too): the platform's
        # own Jobs — Helm hooks of other charts, the sweep database Job — never wait on Kueue's webhook, and inside a team
        # namespace a job without a queue label is suspended instead of running outside every quota and budget hold.
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": contract.LABEL_TEAM, "operator": "Exists"}]},
        "manageJobsWithoutQueueName": True,
    }
    if cfg.kubernetes.kueue.fair_sharing:
        out["fairSharing"] = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
    return out


def kueue(cfg: PlatformConfig) -> dict[str, Any]:
    # enablePrometheus off: the chart's ServiceMonitor is replaced by the platform's (monitoring.kueue_service_monitor).
    return {"enablePrometheus": False, "enableCertManager": False,
            "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(kueue_configuration(cfg), sort_keys=False)},
            "controllerManager": {"nodeSelector": SYSTEM_NODES}}


def cluster_autoscaler(cfg: PlatformConfig, role_arn: Any) -> dict[str, Any]:
    return {
        "cloudProvider": "aws", "awsRegion": cfg.region,
        "autoDiscovery": {"clusterName": cfg.cluster_name},  # finds the node groups' ASGs by their discovery tags
        "rbac": {"serviceAccount": {"name": contract.AUTOSCALER_SERVICE_ACCOUNT, "annotations": {contract.IRSA_ROLE_ANNOTATION: role_arn}}},
        "image": {"tag": versions.cluster_autoscaler_image_tag(cfg.cluster.version)},  # its minor is the cluster's, newest patch
        "nodeSelector": SYSTEM_NODES,
        "resources": requests("100m", "300Mi", "1Gi"),
        "extraArgs": {
            "expander": cfg.kubernetes.autoscaler.expander,
            "scale-down-unneeded-time": durations.go(durations.seconds(cfg.kubernetes.autoscaler.scale_down_unneeded_time)),
            "balance-similar-node-groups": True,
            "skip-nodes-with-system-pods": False,
        },
    }


def kube_prometheus_stack(cfg: PlatformConfig) -> dict[str, Any]:
    mon = cfg.kubernetes.monitoring
    return {
        # The operator's CRDs sit in the chart's crds subchart's crds/, which Helm installs once and never upgrades. The
        # chart's own pre-upgrade hook applies them server-side on every install and upgrade (taking them over from
        # Helm), so a re-pinned chart (`kubernetes.charts`) brings its operator's CRDs with it.
        "crds": {"enabled": True, "upgradeJob": {
            "enabled": True,
            "image": {"busybox": image_values(versions.DIRECTORY_JOB_IMAGE)},  # the chart's default: docker.io busybox:latest
            "nodeSelector": SYSTEM_NODES,
            "resources": requests("50m", "64Mi", "256Mi"),
            "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
            "containerSecurityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }},
        # EKS runs the control plane: no controller-manager, scheduler or etcd pods to scrape (their *Down alerts would
        # fire for ever), and kube-proxy's metrics listen on 127.0.0.1 only. Their scrapes and rules are off.
        "kubeControllerManager": {"enabled": False}, "kubeScheduler": {"enabled": False}, "kubeEtcd": {"enabled": False},
        "kubeProxy": {"enabled": False},
        "prometheusOperator": {
            "resources": requests("100m", "128Mi", "512Mi"),
            "prometheusConfigReloader": {"resources": requests("10m", "32Mi", "64Mi")},
            "admissionWebhooks": {"patch": {"resources": requests("10m", "32Mi", "64Mi")}},
            "nodeSelector": SYSTEM_NODES,
        },
        "prometheus": {"prometheusSpec": {
            "retention": f"{mon.retention_days}d",
            "resources": requests("500m", "2Gi", "6Gi"),
            "storageSpec": {"volumeClaimTemplate": {"spec": {"storageClassName": storage.BLOCK_STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                                                             "resources": {"requests": {"storage": f"{mon.storage_gib}Gi"}}}}},
            # Select PodMonitors, ServiceMonitors and rules labelled `release: kube-prometheus-stack` (the chart's default).
            "podMonitorSelectorNilUsesHelmValues": True, "serviceMonitorSelectorNilUsesHelmValues": True,
            "ruleSelectorNilUsesHelmValues": True,
            **monitoring.PROMETHEUS_SCRAPE_LIMITS,
            "nodeSelector": SYSTEM_NODES,
        }},
        "grafana": {"enabled": True, "resources": requests("100m", "256Mi", "512Mi"), "nodeSelector": SYSTEM_NODES,
                    "testFramework": {"enabled": False},  # a test hook pod, run only by `helm test`
                    # Grafana's sidecar reads ConfigMaps and Secrets: only in its own namespace (a Role, not a ClusterRole
                    # over every team's Secrets), where the platform's dashboards are (monitoring.dashboard_config_map).
                    "rbac": {"namespaced": True},
                    "sidecar": {"resources": requests("25m", "64Mi", "256Mi"),
                                # kube-prometheus-stack sets ALL: with only a Role here the sidecar's cluster-wide
                                # list is refused and no dashboard would ever load.
                                "dashboards": {"enabled": True, "label": "grafana_dashboard", "labelValue": "1",
                                               "searchNamespace": contract.NAMESPACE_MONITORING}}},
        "kube-state-metrics": {"resources": requests("50m", "128Mi", "512Mi"), "nodeSelector": SYSTEM_NODES},
        "prometheus-node-exporter": {"resources": requests("25m", "32Mi", "128Mi")},
        "alertmanager": {"enabled": True, "alertmanagerSpec": {"resources": requests("25m", "64Mi", "256Mi"), "nodeSelector": SYSTEM_NODES}},
    }


def image_values(ref: str) -> dict[str, str]:
    """`registry/repository:tag` as the registry, repository and tag a chart's image values take apart."""
    registry, rest = ref.split("/", 1)
    repository, tag = rest.rsplit(":", 1)
    return {"registry": registry, "repository": repository, "tag": tag}


def chart_image(ref: str) -> dict[str, str]:
    """`repo[:tag][@sha256:...]` (the pushed runtime image's ref, or the stack's own) as the MLflow chart's image values,
    which it joins back as repository:tag[@digest]: a digest pins what runs; a ref without a tag keeps `latest`."""
    name, _, digest = ref.partition("@")
    last = name.rsplit("/", 1)[-1]
    repository, tag = (name.rsplit(":", 1) if ":" in last else (name, "latest"))
    return {"repository": repository, "tag": tag, **({"digest": digest} if digest else {})}


def migration_image(image: Any) -> Any:
    """The chart's migration init container takes no digest value (its schema refuses one) and joins repository:tag,
    so a digest rides in the tag: `repo:v1@sha256:...`, the same pinned image as the server."""
    def joined(values: dict[str, str]) -> dict[str, str]:
        tag = f"{values['tag']}@{values['digest']}" if values.get("digest") else values["tag"]
        return {"repository": values["repository"], "tag": tag}
    return image.apply(joined) if hasattr(image, "apply") else joined(image)


def mlflow(cfg: PlatformConfig, *, database_host: Any, database_secret: str, artifacts_bucket: Any, role_arn: Any,
           flask_secret_key: Any, image: Any) -> dict[str, Any]:
    """The tracking server on RDS PostgreSQL; artifacts proxied to S3 through the server's IRSA role, so training
    pods need no S3 permission for them. Every request is authenticated (platform/manifests/tracking.py); the Flask
    session key is the stack's (stable across upgrades, not the chart's per-render random one).

    It runs on the runtime image (`image`: chart_image's values), which carries MLflow's server at the chart's
    appVersion and trainforge's auth app (trainer/mlflow_auth.py): the team boundary basic-auth alone does not draw.
    The database migration runs on it too, so the server pod pulls no third-party MLflow image."""
    features = cfg.kubernetes.mlflow.server_features
    return {
        "image": image,
        "initImages": {"mlflowDbMigration": migration_image(image)},
        "extraEnvVars": tracking.server_env(features),
        "auth": tracking.chart_auth(database_host=database_host, database_secret=database_secret, features=features),
        "flaskServerSecretKey": flask_secret_key,
        "replicaCount": cfg.kubernetes.mlflow.replicas,
        "service": {"port": contract.MLFLOW_PORT},
        # MLflow >= 3.5 answers 403 "Invalid Host header" to any Host but localhost and private IPs (/health is exempt,
        # so the pod looks ready): the in-cluster names clients use must be allowed.
        "serverAllowedHosts": mlflow_hosts(),
        "resources": requests("250m", "512Mi", "2Gi"),
        "serviceAccount": {"create": True, "name": contract.MLFLOW_SERVICE_ACCOUNT, "annotations": {contract.IRSA_ROLE_ANNOTATION: role_arn}},
        "backendStore": {
            "databaseMigration": True,
            "postgres": {"enabled": True, "host": database_host, "port": contract.POSTGRES_PORT, "database": contract.MLFLOW_DATABASE},
            "existingDatabaseSecret": {"name": database_secret, "usernameKey": "username", "passwordKey": "password"},
        },
        "artifactRoot": {"proxiedArtifactStorage": True, "s3": {"enabled": True, "bucket": artifacts_bucket, "path": contract.MLFLOW_ARTIFACT_PATH}},
        "postgresql": {"enabled": False},
        "nodeSelector": SYSTEM_NODES,
    }


# What `kubectl port-forward` to the UI sends as Host: the local end, on whatever port was chosen (MLflow matches the
# header with fnmatch where a pattern has `*`: mlflow/server/security_utils.py is_allowed_host_header).
PORT_FORWARD_HOSTS = ("localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*")


def mlflow_hosts() -> list[str]:
    """Every Host header a client sends: in the cluster, the service's short, namespaced and fully qualified names, each
    with and without the port (MLflow matches the header as sent); from a laptop, a port-forward's local end. Nothing
    else: serverAllowedHosts replaces MLflow's defaults (which admit any private address)."""
    service = contract.MLFLOW_SERVICE_NAME
    names = [service, f"{service}.{contract.NAMESPACE_MLFLOW}", f"{service}.{contract.NAMESPACE_MLFLOW}.svc",
             f"{service}.{contract.NAMESPACE_MLFLOW}.svc.cluster.local"]
    return [*names, *(f"{n}:{contract.MLFLOW_PORT}" for n in names), *PORT_FORWARD_HOSTS]


def opencost(cfg: PlatformConfig) -> dict[str, Any]:
    """Cost allocation per namespace from the platform's Prometheus and AWS list prices; its own metrics scraped by
    that Prometheus (OpenCost computes allocations from them). The budget controller reads its allocation API."""
    return {
        "opencost": {
            "exporter": {"defaultClusterId": cfg.cluster_name},
            "prometheus": {"internal": {"enabled": True, "serviceName": contract.PROMETHEUS_SERVICE_NAME,
                                        "namespaceName": contract.NAMESPACE_MONITORING, "port": contract.PROMETHEUS_PORT}},
            "metrics": {"serviceMonitor": {"enabled": True, "additionalLabels": {"release": contract.PROMETHEUS_RELEASE}}},
            "nodeSelector": SYSTEM_NODES,
        },
    }
