"""The Kubernetes layer: thin components that apply platform/manifests on the AWS layer's cluster, through its
Kubernetes provider. Order matters only where the cluster needs it (platform/plan/first_up.py states each rule and
checks the program against it): everything that runs a pod after the system nodes and their add-ons; custom
resources after the release that installs their CRDs (every ServiceMonitor, PodMonitor and PrometheusRule after
kube-prometheus-stack); Prometheus after the StorageClass its volume is claimed from; the controller after its image.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from trainforge import contract
from trainforge import kueue as core_kueue
from trainforge.infra.database import USERNAME
from trainforge.infra.iam import Role
from trainforge.infra.layer import AwsLayer
from trainforge.platform.components.objects import apply, apply_crd, helm_release
from trainforge.platform.manifests import charts as chart_table
from trainforge.platform.manifests import budget, crds, guardrails, kueue, monitoring, network, storage, tenancy, tracking, values
from trainforge.platform.training.runtime import cluster_training_runtimes
from trainforge.registries import ImageSources
from trainforge.stackconfig import PlatformConfig, TeamConfig

MANAGED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_LABEL_VALUE}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(MANAGED)}}


class Scheduling(pulumi.ComponentResource):
    """Kueue, its ResourceFlavors (one per node flavour), the cohort and the priority classes."""

    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, after: Sequence[pulumi.Resource],
                 monitoring_release: pulumi.Resource, opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:Scheduling", name, None, opts)
        ns = apply(namespace(contract.NAMESPACE_KUEUE), parent=self)
        self.network_policies = [apply(p, parent=self, depends_on=[ns]) for p in network.kueue_system(cfg)]
        # Kueue's CRDs are templates of its chart: uninstalling the release would delete them and with them every queue
        # and admitted workload. The engine never uninstalls it (a replacement, which only a new name or namespace
        # forces, fails on the name instead).
        self.release = helm_release(charts["kueue"], values.kueue(cfg), images=images, parent=self, depends_on=[ns, *self.network_policies, *after],
                                    retain_on_delete=True)
        objects = [*core_kueue.resource_flavors(cfg), kueue.cohort(), *kueue.workload_priority_classes()]
        self.objects = [apply(o, parent=self, depends_on=[self.release]) for o in objects]
        self.objects.append(apply(monitoring.kueue_service_monitor(), parent=self, depends_on=[self.release, monitoring_release]))
        self.register_outputs({"namespace": contract.NAMESPACE_KUEUE, "version": charts["kueue"].version})


class TrainingOperators(pulumi.ComponentResource):
    """Kubeflow Trainer (with JobSet) and the trainforge-torch runtimes; the v1 training operator if the stack asks."""

    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, default_image: pulumi.Input[str],
                 after: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:TrainingOperators", name, None, opts)
        ns = apply(namespace(contract.NAMESPACE_TRAINER), parent=self)
        self.network_policies = [apply(p, parent=self, depends_on=[ns]) for p in network.training_operators(cfg)]
        # The chart's crds/ (and its JobSet subchart's) as the program's own resources: Helm would install them once and
        # never upgrade them (platform/manifests/crds.py).
        self.crds = [apply_crd(c, parent=self) for c in crds.trainer_crds()]
        self.release = helm_release(charts["kubeflow-trainer"], values.kubeflow_trainer(cfg), images=images, parent=self,
                                    depends_on=[ns, *self.network_policies, *after, *self.crds], skip_crds=True)
        self.runtimes = [apply(r, parent=self, depends_on=[self.release]) for r in cluster_training_runtimes(default_image)]
        if cfg.kubernetes.training_operator:
            # No upstream chart: the kustomize overlay at the pinned tag (fetched by `pulumi up`, rendered by the provider).
            k8s.kustomize.v2.Directory(f"{name}-training-operator", directory=chart_table.TRAINING_OPERATOR_MANIFESTS,
                                       opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({"namespace": contract.NAMESPACE_TRAINER, "runtimes": list(contract.TRAINING_RUNTIME_GRACE_S)})


class GpuNodeAddons(pulumi.ComponentResource):
    """Device plugins: NVIDIA on every GPU node, AWS EFA on EFA nodes (only when the stack has EFA groups)."""

    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, after: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:GpuNodeAddons", name, None, opts)
        self.releases = [helm_release(charts["nvidia-device-plugin"], values.nvidia_device_plugin(cfg), images=images, parent=self, depends_on=after)]
        if any(g.efa for g in cfg.node_groups):
            self.releases.append(helm_release(charts["aws-efa-k8s-device-plugin"], values.efa_device_plugin(cfg), images=images, parent=self,
                                              depends_on=after))
        self.register_outputs({})


class Monitoring(pulumi.ComponentResource):
    """kube-prometheus-stack, the DCGM exporter, the trainer PodMonitor, the training alerts and the dashboard."""

    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, after: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions):
        """`after`: the system nodes, their add-ons (the EBS CSI driver provisions Prometheus' volume) and the
        StorageClass it is claimed from."""
        super().__init__("trainforge:platform:Monitoring", name, None, opts)
        ns = apply(namespace(contract.NAMESPACE_MONITORING), parent=self)
        # Before anything runs here (the chart's admission hook Jobs included): its pods start under their allowances.
        self.network_policies = [apply(p, parent=self, depends_on=[ns]) for p in network.monitoring(cfg)]
        self.release = helm_release(charts[contract.PROMETHEUS_RELEASE], values.kube_prometheus_stack(cfg), images=images, parent=self,
                                    depends_on=[ns, *self.network_policies, *after])
        # The exporter's chart creates a ServiceMonitor: the operator's CRDs must exist first.
        self.dcgm = helm_release(charts["dcgm-exporter"], values.dcgm_exporter(cfg), images=images, parent=self, depends_on=[self.release])
        mon = cfg.kubernetes.monitoring
        self.objects = [apply(monitoring.trainer_pod_monitor(), parent=self, depends_on=[self.release]),
                        apply(monitoring.prometheus_rule(mon), parent=self, depends_on=[self.release]),
                        apply(monitoring.dashboard_config_map(), parent=self, depends_on=[ns])]
        self.register_outputs({"prometheus": contract.PROMETHEUS_URL, "grafana": contract.GRAFANA_URL})


class Autoscaler(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, role: Role,
                 after: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:Autoscaler", name, None, opts)
        # After the role's policies: a pod that assumes a role without them fails its first AWS calls and crash-loops.
        self.release = helm_release(charts["cluster-autoscaler"], values.cluster_autoscaler(cfg, role.arn), images=images, parent=self,
                                    depends_on=[*after, *role.ready])
        self.register_outputs({})


class SharedStorage(pulumi.ComponentResource):
    """The default block StorageClass (encrypted gp3) for the platform's own volumes; the FSx file system as a static
    StorageClass and, per team the platform stack declares, a read-write and a read-only volume."""

    TYPE = "trainforge:platform:SharedStorage"

    def __init__(self, name: str, cfg: PlatformConfig, aws: AwsLayer, opts: pulumi.ResourceOptions):
        super().__init__(self.TYPE, name, None, opts)
        self.block = apply(storage.block_storage_class(aws.data_key.arn), parent=self, depends_on=aws.system_ready)
        self.storage_class = apply(storage.storage_class(), parent=self)
        # Per team, its read-write and read-only volume: a team's claims bind to its own volumes only (volumeName).
        self.volumes = {team.name: [apply(v, parent=self) for v in storage.team_volumes(team.name, **fsx_volume(cfg, aws),
                                                                                         datasets_path=cfg.fsx.datasets_path)]
                        for team in cfg.teams}
        self.objects = [self.storage_class, *(volume for volumes in self.volumes.values() for volume in volumes)]
        self.register_outputs({"storage_class": storage.STORAGE_CLASS})


def fsx_volume(cfg: PlatformConfig, aws: AwsLayer) -> dict[str, Any]:
    fs = aws.file_system
    return dict(file_system_id=fs.id, dns_name=fs.dns_name, mount_name=fs.mount_name, capacity_gib=cfg.fsx.storage_capacity_gib)


def team_directory_job(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    return storage.team_directory_job(team.name, tenancy.cost_labels(team, cfg.environment), cfg.fsx.datasets_path)


def team_quota_job(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any] | None:
    """The Job that sets the team's FSx group quota; None where the team has none."""
    gib = cfg.fsx_quota_gib(team)
    return None if gib is None else storage.team_quota_job(team.name, gib, tenancy.cost_labels(team, cfg.environment))


class TeamDirectories(pulumi.ComponentResource):
    """The FSx root in trainforge's namespace and, per team the platform stack declares, the Job that creates and owns
    `/fsx/teams/<team>` (`jobs[team]`: the team's objects wait for it; Pulumi waits for a Job to complete), and the one
    that sets its quota (`quota_jobs[team]`, on the root mounted again in kube-system)."""

    TYPE = "trainforge:platform:TeamDirectories"

    def __init__(self, name: str, cfg: PlatformConfig, aws: AwsLayer, system: pulumi.Resource,
                 after: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions):
        super().__init__(self.TYPE, name, None, opts)
        root = [apply(o, parent=self, depends_on=[system, *after]) for o in storage.root_volume(**fsx_volume(cfg, aws))]
        # Its pod needs a system node and the FSx CSI node plugin (system_ready).
        self.jobs = {team.name: apply(team_directory_job(cfg, team), parent=self, depends_on=[*root, *aws.system_ready])
                     for team in cfg.teams}
        quota_root = [apply(o, parent=self, depends_on=[*after]) for o in storage.quota_root_volume(**fsx_volume(cfg, aws))]
        self.quota_jobs = {team.name: apply(job, parent=self, depends_on=[*quota_root, *aws.system_ready])
                           for team in cfg.teams if (job := team_quota_job(cfg, team)) is not None}
        self.register_outputs({"teams": sorted(self.jobs)})


class Guardrails(pulumi.ComponentResource):
    """The admission policies over every team namespace: a team's jobs use its own queue, its pods run as its own
    identity and mount only its own storage (platform/manifests/guardrails.py)."""

    def __init__(self, name: str, opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:Guardrails", name, None, opts)
        priority_classes = [c["metadata"]["name"] for c in kueue.workload_priority_classes()]
        self.objects = [apply(o, parent=self) for o in guardrails.objects(priority_classes)]
        self.register_outputs({"policies": [guardrails.JOBS_POLICY, guardrails.PODS_POLICY]})


class TrackingServer(pulumi.ComponentResource):
    """MLflow on the stack's RDS PostgreSQL as its own role (the master user's credentials reach only the bootstrap
    Jobs); every password reaches the chart only as a Kubernetes Secret."""

    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, aws: AwsLayer,
                 monitoring_release: pulumi.Resource, image: pulumi.Input[str], opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:TrackingServer", name, None, opts)
        ns = apply(namespace(contract.NAMESPACE_MLFLOW), parent=self)
        secret = apply(database_secret(aws), parent=self, depends_on=[ns])
        # Before anything runs here: the Jobs and the server start under the namespace's allowances, not before them.
        policies = [apply(p, parent=self, depends_on=[ns]) for p in tracking.network_policies(cfg)]
        self.namespace, self.secret, self.network_policies = ns, secret, policies
        child = pulumi.ResourceOptions(parent=self)
        # Alphanumeric: the chart's init container puts the admin password into the auth ini with sed.
        admin_password = random.RandomPassword(f"{name}-admin", length=32, special=False, opts=child)
        flask_key = random.RandomPassword(f"{name}-flask", length=48, special=False, opts=child)
        admin = apply(tracking.admin_secret(pulumi.Output.secret(admin_password.result)), parent=self, depends_on=[ns])
        defaults = apply(tracking.container_defaults(), parent=self, depends_on=[ns])
        server_password = random.RandomPassword(f"{name}-server-db", length=40, special=False, opts=child)
        server = apply(tracking.server_secret(pulumi.Output.secret(server_password.result)), parent=self, depends_on=[ns])
        databases = [apply(o, parent=self, depends_on=[ns, secret, server, *policies, *aws.system_ready])
                     for o in tracking.database_objects(host=aws.database.instance.address, master_secret=DATABASE_SECRET)]
        chart_values = values.mlflow(cfg, database_host=aws.database.instance.address, database_secret=tracking.SERVER_SECRET,
                                     artifacts_bucket=aws.buckets["artifacts"].bucket, role_arn=aws.mlflow_role.arn,
                                     flask_secret_key=pulumi.Output.secret(flask_key.result),
                                     image=pulumi.Output.from_input(image).apply(values.chart_image))
        self.release = helm_release(charts["mlflow"], chart_values, images=images, parent=self,
                                    depends_on=[ns, server, admin, defaults, *policies, *databases, *aws.system_ready,
                                                *aws.image_cache_ready, monitoring_release])
        self.register_outputs({"tracking_uri": contract.MLFLOW_TRACKING_URI})


class CostControl(pulumi.ComponentResource):
    """OpenCost (cost per namespace from Prometheus and AWS prices) and the budget controller that holds a team's
    ClusterQueue at its monthly budget (platform/manifests/budget.py), scraped for the budget alerts."""

    def __init__(self, name: str, cfg: PlatformConfig, charts: dict[str, chart_table.Chart], images: ImageSources, image: pulumi.Input[str],
                 monitoring_release: pulumi.Resource, after: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:CostControl", name, None, opts)
        ns = apply(namespace(contract.NAMESPACE_OPENCOST), parent=self)
        policies = [apply(p, parent=self, depends_on=[ns]) for p in network.opencost(cfg)]
        # The chart's ServiceMonitor needs the Prometheus operator's CRDs.
        self.release = helm_release(charts["opencost"], values.opencost(cfg), images=images, parent=self,
                                    depends_on=[ns, *policies, monitoring_release, *after])
        self.system = system = apply(namespace(contract.NAMESPACE_SYSTEM), parent=self)  # trainforge's own namespace
        system_policies = [apply(p, parent=self, depends_on=[system]) for p in network.trainforge_system(cfg)]
        self.network_policies = [*policies, *system_policies]
        self.objects = [apply(o, parent=self, depends_on=[system, *system_policies, *after]) for o in budget.controller_objects(cfg, image)]
        self.objects.append(apply(budget.pod_monitor(), parent=self, depends_on=[monitoring_release]))
        self.register_outputs({"opencost": contract.OPENCOST_URL, "budget_controller": contract.BUDGET_CONTROLLER})


DATABASE_SECRET = "mlflow-database"  # the RDS master user's credentials: bootstrap Jobs only (tracking.database_sql, sweeps)


def database_secret(aws: AwsLayer) -> dict[str, Any]:
    encode = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": DATABASE_SECRET, "namespace": contract.NAMESPACE_MLFLOW, "labels": dict(MANAGED)},
            "data": {"username": encode(USERNAME), "password": pulumi.Output.secret(aws.database.password).apply(encode)}}  # type: ignore[arg-type]  # pulumi's Output.secret stub


def shared_storage_name(cfg: PlatformConfig) -> str:
    return f"{cfg.cluster_name}-storage"


def team_directories_name(cfg: PlatformConfig) -> str:
    return f"{cfg.cluster_name}-team-dirs"


def tenancy_name(cfg: PlatformConfig, team: TeamConfig) -> str:
    return f"{cfg.cluster_name}-team-{team.name}"


@dataclass(frozen=True)
class KubernetesLayer:
    outputs: dict[str, Any]


def build_kubernetes_layer(cfg: PlatformConfig, aws: AwsLayer) -> KubernetesLayer:
    """Everything cluster-wide the teams stand on; tenancy (namespaces, queues, access) attaches after it."""
    opts = pulumi.ResourceOptions(providers={"kubernetes": aws.cluster.provider})
    charts = chart_table.pinned(cfg.kubernetes)
    name = cfg.cluster_name
    default_image = aws.runtime_image  # pushed before anything that runs it is created (its output carries the dependency)
    after = aws.system_ready  # pods need a node, DNS and (for volumes) the CSI drivers
    images = aws.image_sources
    pulled = [*after, *aws.image_cache_ready]  # a chart's pods pull through the stack's cache: its rules exist first
    shared = SharedStorage(shared_storage_name(cfg), cfg, aws, opts)
    monitoring_ = Monitoring(f"{name}-monitoring", cfg, charts, images, [*pulled, shared.block], opts)
    scheduling = Scheduling(f"{name}-scheduling", cfg, charts, images, pulled, monitoring_.release, opts)
    TrainingOperators(f"{name}-training", cfg, charts, images, default_image, pulled, opts)
    GpuNodeAddons(f"{name}-gpu-nodes", cfg, charts, images, after, opts)
    cost = CostControl(f"{name}-cost", cfg, charts, images, default_image, monitoring_.release, pulled, opts)
    guard = Guardrails(f"{name}-guardrails", opts)
    directories = TeamDirectories(team_directories_name(cfg), cfg, aws, cost.system, shared.objects[:1], opts)
    Autoscaler(f"{name}-autoscaler", cfg, charts, images, aws.autoscaler_role, pulled, opts)
    tracking_server = TrackingServer(f"{name}-mlflow", cfg, charts, images, aws, monitoring_.release, default_image, opts)
    from trainforge.pricing import price_table
    from trainforge.platform.components.tenancy import SweepDatabase, Tenancy, TrackingUser
    database = SweepDatabase(aws.database.instance.address, DATABASE_SECRET, [tracking_server.namespace, tracking_server.secret, *tracking_server.network_policies])
    tracking_user = TrackingUser(default_image, after=[tracking_server.release])
    for team in cfg.teams:
        Tenancy(tenancy_name(cfg, team), cfg, team, role_arn=aws.team_role_arns[team.name], prices_as_of=price_table().as_of,
                after=[scheduling.release, shared.storage_class, *shared.volumes[team.name], *guard.objects, directories.jobs[team.name],
                       *([directories.quota_jobs[team.name]] if team.name in directories.quota_jobs else [])], database=database,
                tracking=tracking_user, opts=opts)
    return KubernetesLayer({
        "kubernetes": {
            "namespaces": {"kueue": contract.NAMESPACE_KUEUE, "trainer": contract.NAMESPACE_TRAINER,
                           "monitoring": contract.NAMESPACE_MONITORING, "mlflow": contract.NAMESPACE_MLFLOW,
                           "opencost": contract.NAMESPACE_OPENCOST, "system": contract.NAMESPACE_SYSTEM},
            "charts": {c.release: c.version for c in charts.values()},
            "training_runtimes": list(contract.TRAINING_RUNTIME_GRACE_S),
            "mlflow_tracking_uri": contract.MLFLOW_TRACKING_URI,
            "prometheus_url": contract.PROMETHEUS_URL, "grafana_url": contract.GRAFANA_URL, "opencost_url": contract.OPENCOST_URL,
            "fsx_storage_class": storage.STORAGE_CLASS, "block_storage_class": storage.BLOCK_STORAGE_CLASS,
        },
    })
