"""Every name that crosses a layer boundary, spelled once.

The AWS layer puts these labels, taints and tags on nodes; the platform layer builds queues and
namespaces from them; the submitter selects nodes and tolerates taints with them. Import, never retype.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PROJECT = "trainforge"
LABEL_DOMAIN = "trainforge.io"

# The API versions of the operators' kinds that the program writes and the CLI and controllers read: the versions the
# pinned CRDs serve (versions.py, ../shared/schemas). A CRD upgrade that moves one changes it here, everywhere at once.
KUEUE_API = "kueue.x-k8s.io/v1beta2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"  # TrainJob, ClusterTrainingRuntime
PYTORCHJOB_API = "kubeflow.org/v1"


def api_parts(api_version: str) -> tuple[str, str]:
    """(group, version) of an apiVersion, as the API's paths and the client's custom-object calls take them."""
    group, _, version = api_version.rpartition("/")
    return group, version


def api_group(api_version: str) -> str:
    """An apiVersion's group, as RBAC rules and admission policies match it."""
    return api_parts(api_version)[0]


def service_account_subject(namespace: str, service_account: str) -> str:
    """How Kubernetes names a ServiceAccount in a token's `sub` (what an IAM role's IRSA trust matches)."""
    return f"system:serviceaccount:{namespace}:{service_account}"


def quota_requests_key(resource: str) -> str:
    """A ResourceQuota's `hard` key bounding the requests of `resource` (what tenancy writes and policies look for)."""
    return f"requests.{resource}"


def pulumi_type(api_version: str, kind: str) -> str:
    """The Pulumi Kubernetes provider's type token of a kind (what policies and the engine's records name)."""
    return f"kubernetes:{api_version}:{kind}"


class Flavour(str, Enum):
    """A kind of node. The AWS layer derives a node group's flavour from its config. `system` nodes run the platform
    (MLflow with the database's credentials, the budget controller, Kueue, Prometheus) and never a team's pod; teams'
    CPU-only jobs run on `cpu` nodes, their GPU jobs on the GPU flavours."""

    SYSTEM = "system"
    CPU = "cpu"
    GPU_SPOT = "gpu-spot"
    GPU_ONDEMAND = "gpu-ondemand"
    GPU_EFA = "gpu-efa"

    @property
    def has_gpus(self) -> bool:
        return self not in (Flavour.SYSTEM, Flavour.CPU)


GPU_FLAVOURS: tuple[Flavour, ...] = (Flavour.GPU_SPOT, Flavour.GPU_ONDEMAND, Flavour.GPU_EFA)
# Where a team's pods may run: admission refuses a team pod that could land anywhere else (platform/manifests/guardrails.py).
TENANT_FLAVOURS: tuple[Flavour, ...] = (Flavour.CPU, *GPU_FLAVOURS)

# Node labels
LABEL_FLAVOUR = f"{LABEL_DOMAIN}/node-flavour"
LABEL_CAPACITY = f"{LABEL_DOMAIN}/capacity"  # "spot" | "on-demand"
LABEL_NODE_GROUP = f"{LABEL_DOMAIN}/node-group"
LABEL_EFA = f"{LABEL_DOMAIN}/efa"  # "true" on nodes with EFA interfaces
# The GPU model of a GPU node (the cluster-autoscaler AWS provider's GPU label): shared by every type of a node group,
# so jobs select it rather than an instance type the group may not launch.
LABEL_ACCELERATOR = "k8s.amazonaws.com/accelerator"


def accelerator_label(gpu_model: str) -> str:
    """"H100" -> "nvidia-h100", "A100-40GB" -> "nvidia-a100-40gb"."""
    return "nvidia-" + gpu_model.lower()


# Taints (Kubernetes spelling of effects; the AWS layer translates to the EKS API's spelling)
TAINT_GPU = "nvidia.com/gpu"
TAINT_SPOT = f"{LABEL_DOMAIN}/spot"
# On the team CPU nodes: what has no node selector (CoreDNS, the CSI controllers, a chart's hook Job) would otherwise
# schedule there, beside teams' pods, with its credentials. Every tenant node is tainted (the GPU ones by TAINT_GPU),
# so only pods that tolerate a tenant flavour (teams', rendered from these traits) and node agents land on them.
TAINT_TEAM_CPU = f"{LABEL_DOMAIN}/team-cpu"

# Extended resources
RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_EFA = "vpc.amazonaws.com/efa"
RESOURCE_EPHEMERAL_STORAGE = "ephemeral-storage"
# What Kueue's Configuration leaves out of quota (resources.excludeResourcePrefixes: an exact name, or a prefix before
# "/"): a team pod's scratch disk is bounded by its own limit and the namespace's ResourceQuota, not by the
# ClusterQueue (which would otherwise refuse every job that requests it: "resource unavailable in ClusterQueue").
KUEUE_EXCLUDED_RESOURCES = (RESOURCE_EPHEMERAL_STORAGE,)

# Storage
FSX_CLAIM_NAME = "trainforge-fsx"  # read-write, in every team namespace
FSX_DATASETS_CLAIM_NAME = "trainforge-datasets"  # the same file system, mounted read-only
FSX_MOUNT_PATH = "/fsx"
# The identity the runtime image is built with (Dockerfile: USER 1000:1000), what local jobs run as. On the cluster
# every team runs as its own identity (team_posix_id), enforced at admission.
RUNTIME_UID = RUNTIME_GID = 1000
# Team identities: above every distribution's system and first-user ranges, below 2^31 (Lustre and the kubelet take
# any uid_t, the API server an int64; 2^31 keeps it safe for every tool that reads a signed 32-bit id).
TEAM_POSIX_ID_BASE = 1_000_000
TEAM_POSIX_ID_SPAN = 1_000_000_000


def team_posix_id(team: str) -> int:
    """The uid (and gid) every pod of `team` runs as and its FSx directory belongs to. Derived from the name alone, so
    the CLI, the platform and the admission policy agree without a lookup and a team keeps it across re-creation; two
    teams of one stack that collide are refused by the stack config (odds about 1 in 10^7 for 100 teams)."""
    import hashlib
    digest = int.from_bytes(hashlib.sha256(f"trainforge-team:{team}".encode()).digest()[:8], "big")
    return TEAM_POSIX_ID_BASE + digest % TEAM_POSIX_ID_SPAN


FSX_TEAMS_DIR = "teams"  # under the file system's root
FSX_DATASETS_DIR = "datasets"  # where pods see the data repository: /fsx/datasets, read-only


def fsx_team_dir(team: str) -> str:
    """Where a team's jobs write, as pods see it: the team's PV mounts only this directory of the file system."""
    return f"{FSX_MOUNT_PATH}/{FSX_TEAMS_DIR}/{team}"


def fsx_job_paths(team: str, job: str) -> dict[str, str]:
    """A cluster job's run directory and checkpoints, as its pods see them (the local layout is trainforge.paths')."""
    base = f"{fsx_team_dir(team)}/jobs/{job}"
    return {"output_dir": f"{base}/run", "checkpoint_dir": f"{base}/checkpoints"}


FSX_DATASETS_MOUNT = f"{FSX_MOUNT_PATH}/{FSX_DATASETS_DIR}"


# Cost-allocation tag keys (AWS tags on every resource; Kubernetes labels on team objects)
TAG_PROJECT = "project"
TAG_ENVIRONMENT = "environment"
TAG_COST_CENTRE = "cost-centre"
TAG_OWNER = "owner"
TAG_MANAGED_BY = "managed-by"
TAG_TEAM = "team"
REQUIRED_COST_TAGS: tuple[str, ...] = (TAG_PROJECT, TAG_ENVIRONMENT, TAG_COST_CENTRE, TAG_OWNER, TAG_MANAGED_BY)
MANAGED_BY_VALUE = "pulumi-trainforge"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"  # Kubernetes spelling


# Kubernetes spells taint effects NoSchedule; the EKS node group API spells them NO_SCHEDULE.
EKS_TAINT_EFFECTS = {"NoSchedule": "NO_SCHEDULE", "NoExecute": "NO_EXECUTE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}
KUBERNETES_TAINT_EFFECTS = {eks: kubernetes for kubernetes, eks in EKS_TAINT_EFFECTS.items()}


@dataclass(frozen=True)
class FlavourTraits:
    """What every node of a flavour carries, whichever node group it comes from."""

    labels: dict[str, str]
    taints: tuple[Taint, ...]


def flavour_traits(flavour: Flavour) -> FlavourTraits:
    labels = {LABEL_FLAVOUR: flavour.value}
    taints: list[Taint] = []
    if flavour.has_gpus:
        taints.append(Taint(TAINT_GPU, "present"))
    if flavour is Flavour.CPU:
        taints.append(Taint(TAINT_TEAM_CPU, "true"))
    if flavour is Flavour.GPU_SPOT:
        labels[LABEL_CAPACITY] = "spot"
        taints.append(Taint(TAINT_SPOT, "true"))
    else:
        labels[LABEL_CAPACITY] = "on-demand"
    if flavour is Flavour.GPU_EFA:
        labels[LABEL_EFA] = "true"
    return FlavourTraits(labels=labels, taints=tuple(taints))


def queue_name(team: str) -> str:
    """Kueue LocalQueue a team submits to (in the team's namespace)."""
    return f"{team}-queue"


# An `entry.command` job's hyperparameters, as one JSON object in this variable of every rank (a command reads no
# RunConfig; `json.loads(os.environ["TRAINFORGE_HYPERPARAMETERS"])` gets them, sweeps' sampled values included).
HYPERPARAMETERS_ENV = "TRAINFORGE_HYPERPARAMETERS"

# Where EKS puts Service ClusterIPs when the cluster names no range (the EKS API's kubernetesNetworkConfig:
# "either the 10.100.0.0/16 or 172.20.0.0/16 CIDR blocks"): outside the VPC, so a policy excepting the VPC must
# except these too, or a team pod reaches every in-cluster Service on an allowed port before its address is translated.
EKS_DEFAULT_SERVICE_CIDRS = ("10.100.0.0/16", "172.20.0.0/16")

TEAM_NAMESPACE_PREFIX = "team-"
# Every training container: no privilege escalation and no capability (Pod Security `restricted`, enforced in team
# namespaces). EFA and GPUs come through device plugins, /dev/shm is an emptyDir: none needs a capability.
TRAINING_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def namespace_name(team: str) -> str:
    return f"{TEAM_NAMESPACE_PREFIX}{team}"


# The service account training pods run as, in each team namespace; its IRSA role is the team's AWS identity.
TRAINING_SERVICE_ACCOUNT = "trainforge-trainer"
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value (63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric)."""
    import re
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")


def team_group(team: str) -> str:
    """The Kubernetes group a team's members act as: their EKS access entries map them to it, its RoleBinding grants it."""
    return f"trainforge:team:{team}"


ORGANISATION_GROUP = "trainforge:organisation"  # every member of every team (a team may let it read its jobs)


def team_s3_prefix(team: str) -> str:
    """Where a team's checkpoints and artifacts live inside the shared buckets."""
    return f"teams/{team}/"


# Worker exit codes and how a rank reports its own: trainforge/exits.py.


# Scheduling: Kueue labels on every job, WorkloadPriorityClasses and the training runtime the platform installs.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PRIORITIES = ("low", "normal", "high")
CLUSTER_TRAINING_RUNTIME = "trainforge-torch"  # a ClusterTrainingRuntime (Kubeflow Trainer v2): on-demand jobs
CLUSTER_TRAINING_RUNTIME_SPOT = "trainforge-torch-spot"  # the same, with the grace period a spot notice needs
# The runtime's replicated job and container: the TrainJob's runtime patch and its restart rules name them.
TRAINJOB_REPLICATED_JOB = "node"
TRAINJOB_CONTAINER = "node"
LABEL_JOB = f"{LABEL_DOMAIN}/job"
# A team's namespace, its objects and its jobs' pods carry it: Kueue manages the namespaces that have it.
LABEL_TEAM = f"{LABEL_DOMAIN}/{TAG_TEAM}"
# The cost tags as Kubernetes labels (OpenCost and the budget read them), and what the program's own objects carry.
LABEL_COST_CENTRE = f"{LABEL_DOMAIN}/{TAG_COST_CENTRE}"
LABEL_ENVIRONMENT = f"{LABEL_DOMAIN}/{TAG_ENVIRONMENT}"
LABEL_MANAGED_BY = f"{LABEL_DOMAIN}/{TAG_MANAGED_BY}"
MANAGED_BY_LABEL_VALUE = PROJECT  # on Kubernetes objects; AWS resources' managed-by tag says MANAGED_BY_VALUE
SPOT_TERMINATION_GRACE_S = 120  # the EC2 spot notice: time for the emergency checkpoint and its upload
ON_DEMAND_TERMINATION_GRACE_S = 60  # an eviction or a cancel: the emergency checkpoint, a smaller upload window
# The runtime must be done this long before the kubelet's SIGKILL: process exit, the launcher's own exit, slack.
PREEMPTION_MARGIN_S = 15
# Trainer 2.2.1 takes no grace period from a TrainJob (its runtime patches lack the field; the API server would
# prune it silently), so each grace class is its own ClusterTrainingRuntime and a TrainJob names the right one.
TRAINING_RUNTIME_GRACE_S = {CLUSTER_TRAINING_RUNTIME: ON_DEMAND_TERMINATION_GRACE_S,
                            CLUSTER_TRAINING_RUNTIME_SPOT: SPOT_TERMINATION_GRACE_S}
METRICS_PORT = 9400
METRICS_PORT_NAME = "metrics"  # the container port name the trainer pods' PodMonitor scrapes
NODE_PRICE_ENV = "TRAINFORGE_NODE_PRICE_USD_PER_HOUR"  # set by the submitter; exported for the dashboard's cost rate
# The GPUs a pod was given, so a worker whose CUDA sees fewer (a driver or fabric manager not up, a GPU gone) stops
# instead of training on the CPU; and the node it runs on (the downward API), named when the hardware fails.
GPUS_PER_NODE_ENV = "TRAINFORGE_GPUS_PER_NODE"
NODE_NAME_ENV = "TRAINFORGE_NODE_NAME"

# Where the platform's add-ons live (the Kubernetes half of the platform contract).
NAMESPACE_KUBE_SYSTEM = "kube-system"  # Kubernetes' own: DNS, EKS add-ons
NAMESPACE_GPU = NAMESPACE_KUBE_SYSTEM  # device plugins run with the node-critical priority classes there
NAMESPACE_AUTOSCALER = NAMESPACE_KUBE_SYSTEM
NAMESPACE_TRAINER = "kubeflow-system"
NAMESPACE_KUEUE = "kueue-system"
NAMESPACE_MONITORING = "monitoring"
# The kube-prometheus-stack release: its name labels what its Prometheus selects and names its Services.
PROMETHEUS_RELEASE = "kube-prometheus-stack"
PROMETHEUS_SERVICE_NAME = f"{PROMETHEUS_RELEASE}-prometheus"
NAMESPACE_MLFLOW = "mlflow"
MLFLOW_PORT = 5000
MLFLOW_SERVICE_NAME = "mlflow"  # the chart's Service (its release name, fullnameOverride-free)
MLFLOW_TRACKING_URI = f"http://{MLFLOW_SERVICE_NAME}.{NAMESPACE_MLFLOW}.svc.cluster.local:{MLFLOW_PORT}"
# Run tags and experiment names in MLflow: trainforge/run_tags.py.
# Each team signs in to MLflow as its own user (MLflow's basic-auth app, default permission NO_PERMISSIONS): the
# experiments a team creates are its own. The credentials: Secret MLFLOW_SECRET in the team's namespace.
MLFLOW_SECRET = "trainforge-mlflow"
MLFLOW_USERNAME_KEY, MLFLOW_PASSWORD_KEY = "username", "password"
# The environment of the Job that makes a team's MLflow user (platform) and the module it runs (trainer).
MLFLOW_USER_ENV = {"admin_username": "MLFLOW_ADMIN_USERNAME", "admin_password": "MLFLOW_ADMIN_PASSWORD",
                   "username": "MLFLOW_TEAM_USERNAME", "password": "MLFLOW_TEAM_PASSWORD"}


def mlflow_user(team: str) -> str:
    return f"team-{team}"


# The tracking server's auth app (trainer/mlflow_auth.py, `--app-name trainforge-auth`) and the MLflow features it keeps
# off unless the stack lists them in kubernetes.mlflow.server_features (each lets a user make the server act for them).
MLFLOW_AUTH_APP = "trainforge-auth"
# Its credential check (the chart's auth.authorizationFunction): basic-auth's, without re-running scrypt per request;
# and basic-auth's own (the chart's default), kept where a server feature is on (platform/manifests/tracking.py).
MLFLOW_AUTH_FUNCTION = "trainforge.trainer.mlflow_auth:authenticate_request"
MLFLOW_BASIC_AUTH_FUNCTION = "mlflow.server.auth:authenticate_request_basic_auth"
MLFLOW_SERVER_FEATURES = ("gateway", "jobs", "scorers")
MLFLOW_FEATURES_ENV = "TRAINFORGE_MLFLOW_FEATURES"


def team_of_mlflow_user(username: str) -> str | None:
    """The team an MLflow user was made for (mlflow_user's inverse); None for the admin or anyone else."""
    if not username.startswith("team-"):
        return None
    return username[len("team-"):] or None


PROMETHEUS_PORT = 9090  # the Prometheus server's (what the platform's Service, its network policies and OpenCost use)
PROMETHEUS_URL = f"http://{PROMETHEUS_SERVICE_NAME}.{NAMESPACE_MONITORING}.svc.cluster.local:{PROMETHEUS_PORT}"
GRAFANA_URL = f"http://{PROMETHEUS_RELEASE}-grafana.{NAMESPACE_MONITORING}.svc.cluster.local:80"
AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"
MLFLOW_SERVICE_ACCOUNT = "mlflow"
# Where MLflow proxies artifacts in the artifacts bucket: the chart's artifactRoot path, and the prefix its IRSA role
# may read and write (one name, or the server's writes are AccessDenied).
MLFLOW_ARTIFACT_PATH = "mlflow"
KUEUE_COHORT = "trainforge"  # every team's ClusterQueue borrows and lends within it


def preemption_window_s(termination_grace_s: int) -> int:
    """How long the runtime may spend on its emergency checkpoint and upload after SIGTERM (its preemption_grace_s)."""
    return termination_grace_s - PREEMPTION_MARGIN_S


# torchrun SIGKILLs its workers this long after passing SIGTERM on (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default:
# shorter than either window, so an emergency checkpoint taking longer died half-written). Set after the runtime's own
# deadline and before the kubelet's SIGKILL, it only ends workers stuck past their window.
TORCHRUN_SHUTDOWN_MARGIN_S = 5


TORCHRUN_SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"  # torch 2.13 launcher/api.py LaunchConfig


def torchrun_shutdown_timeout_s(termination_grace_s: int) -> int:
    """How long torchrun waits for its workers after passing SIGTERM on, in a pod with this grace period."""
    return termination_grace_s - TORCHRUN_SHUTDOWN_MARGIN_S


def torchrun_environment(termination_grace_s: int) -> dict[str, str]:
    """What a node's torchrun is told in its environment (a pod's, the local backend's): an environment variable, not
    a launcher argument, so that an image with an older launcher still starts."""
    return {TORCHRUN_SHUTDOWN_TIMEOUT_ENV: str(torchrun_shutdown_timeout_s(termination_grace_s))}


def training_runtime_for(termination_grace_s: int) -> str:
    """The ClusterTrainingRuntime whose pods get this grace period."""
    return next(name for name, grace in TRAINING_RUNTIME_GRACE_S.items() if grace == termination_grace_s)


# The runtime image every pod runs: one ECR repository per stack, tagged with the project version (and commit).
DEFAULT_RUNTIME_IMAGE = "ghcr.io/trainforge/runtime:0.1.0"  # where no stack says otherwise (a local preview)
IMAGE_WORKDIR = "/workspace"  # the image's working directory; rendered containers start there


def runtime_image_repository(environment: str) -> str:
    return f"{PROJECT}-{environment}/runtime"


def runtime_image_tag(version: str) -> str:
    """A release image's tag, v<version>: pushed once per version by `scripts/build-image --release`."""
    return f"v{version}"


def content_image_tag(version: str, context_digest: str) -> str:
    """The tag of an image built from one build context: v<version>-<first 12 hex of the context's digest>. It changes
    exactly when what the image is built from changes (infra/registry.py context_digest), so a later `pulumi up` pushes
    a new tag to the immutable repository, or pushes nothing."""
    return f"v{version}-{context_digest[:12]}"

# The OCI label on the runtime image holding its build context's digest (what its content tag abbreviates).
IMAGE_CONTEXT_LABEL = "io.trainforge.context-digest"


def runtime_image(account_id: str, region: str, environment: str, version: str) -> str:
    return f"{account_id}.dkr.ecr.{region}.amazonaws.com/{runtime_image_repository(environment)}:{runtime_image_tag(version)}"


# Where a team's pods may pull images from: the team settings hold one prefix per key `image-prefix-<n>`, and the
# pod admission policy admits a container whose image starts with one of them (platform/manifests/guardrails.py).
SETTING_IMAGE_PREFIX = "image-prefix-"
# The job priorities a team may use: one key `priority-<priority>` per granted priority, its WorkloadPriorityClass as
# the value; the jobs admission policy admits a job whose priority label is one of them.
SETTING_PRIORITY_PREFIX = "priority-"
# A team pod's groups are the ones its spec names, never ones its image's /etc/group adds (render.pod_identity, the pod
# admission policy, `platform verify`'s node check: a node whose runtime cannot honour it refuses such pods).
SUPPLEMENTAL_GROUPS_POLICY = "Strict"
# A team's priorities unless its config says otherwise: `high` preempts the cohort's lower-priority work, so a stack
# grants it to the teams that should have it.
DEFAULT_TEAM_PRIORITIES = ("low", "normal")


def image_repository_prefixes(image: str) -> list[str]:
    """The prefixes that admit any tag or digest of `image`'s repository, and nothing beside it (`repo:`, `repo@`;
    `repo` alone would admit `repo-evil`)."""
    name = image.split("@", 1)[0]
    host, _, path = name.rpartition("/")
    repository = f"{host}/{path.split(':', 1)[0]}" if host else name.split(":", 1)[0]
    return [f"{repository}:", f"{repository}@"]


def priority_class_name(priority: str) -> str:
    return f"trainforge-{priority}"


def cluster_queue_name(team: str) -> str:
    """The Kueue ClusterQueue holding a team's quota (its LocalQueue points at it)."""
    return f"team-{team}"


# Team settings and the monthly budget: the ConfigMap the platform writes into each team namespace, which the budget
# controller updates and the submitter reads (so `trainforge check/submit` and the cluster agree).
TEAM_SETTINGS_CONFIG_MAP = "trainforge-team"
SETTING_BUDGET_USD = "monthly_budget_usd"  # written by the platform (pulumi up)
SETTING_DEFAULT_IMAGE = "default_image"  # written by the platform: the runtime image it deployed, by digest (what a job that names no image runs)
SETTING_SPENT_USD = "spent_usd"  # written by the budget controller, with the two below
SETTING_SPENT_MONTH = "spent_month"  # YYYY-MM (UTC) the figure belongs to
SETTING_SPENT_AS_OF = "spent_as_of"  # RFC 3339 (UTC), the end of the cost window OpenCost answered for
# JSON {"YYYY-MM-DD": usd}: each settled day of spent_month, kept by the budget controller so month-to-date outlives
# Prometheus' retention (OpenCost reads Prometheus: a day older than its retention would count as $0).
SETTING_SPENT_DAYS = "spent_days"
# A ClusterQueue held for budget carries this annotation: the controller lifts only the holds it set itself.
BUDGET_HOLD_ANNOTATION = f"{LABEL_DOMAIN}/budget-hold"
# On a ClusterQueue `trainforge platform drain-team` drained (HoldAndDrain) for the team's removal: who and when.
DRAIN_ANNOTATION = f"{LABEL_DOMAIN}/draining-for-removal"
NAMESPACE_OPENCOST = "opencost"
OPENCOST_API_PORT = 9003
OPENCOST_URL = f"http://opencost.{NAMESPACE_OPENCOST}.svc.cluster.local:{OPENCOST_API_PORT}"
NAMESPACE_SYSTEM = "trainforge-system"  # trainforge's own controllers
TRAINER_PODMONITOR = "trainforge-trainers"  # the PodMonitor over every team's training pods (platform/manifests/monitoring.py)
BUDGET_CONTROLLER = "trainforge-budget"  # its Deployment, ServiceAccount and ClusterRole
BUDGET_METRICS_PORT = 9401
# The namespaces the platform itself runs in (not kube-system's EKS add-ons): each denies traffic by default
# (platform/manifests/network.py, tracking.py; the pack checks it) and `platform verify` checks their workloads.
PLATFORM_NAMESPACES = (NAMESPACE_KUEUE, NAMESPACE_TRAINER, NAMESPACE_MONITORING, NAMESPACE_MLFLOW, NAMESPACE_OPENCOST, NAMESPACE_SYSTEM)

# Sweeps on the cluster: each team's Optuna database on the platform's PostgreSQL. Its URL (with the team's own
# database user) is in this Secret in the team namespace; trial pods read it from a file the Secret is mounted as —
# not an environment variable, which every child process (DataLoader workers, a command entry's programs) inherits
# and crash reports copy — so no password appears in a TrainJob, an argv or an environment.
SWEEP_STORAGE_SECRET = "trainforge-sweeps"
SWEEP_STORAGE_KEY = "storage"
SWEEP_STORAGE_DIR = "/var/run/trainforge/sweep-database"
SWEEP_STORAGE_FROM_FILE = f"file:{SWEEP_STORAGE_DIR}/{SWEEP_STORAGE_KEY}"  # what a trial's run config says instead of a URL
SWEEP_STORAGE_ENV = "TRAINFORGE_SWEEP_STORAGE"  # `env:NAME` still works where a caller sets it (local trials, tests)
# A cluster sweep's controller runs in the team's namespace as a TrainJob of its own (admitted by Kueue like any job),
# under this ServiceAccount: it may do with jobs what a member may, nothing more. Its TrainJob is the sweep's status
# object: the controller writes the study's state into an annotation (gzip + base64 JSON) that a member reads with
# only a kubeconfig; a member asks it to cancel or extend through annotations of the same object.
SWEEP_CONTROLLER_SERVICE_ACCOUNT = "trainforge-sweep-controller"
SWEEP_ROLE_LABEL = f"{LABEL_DOMAIN}/role"
SWEEP_CONTROLLER_ROLE = "sweep-controller"
SWEEP_NAME_LABEL = f"{LABEL_DOMAIN}/sweep"
SWEEP_STATUS_ANNOTATION = f"{LABEL_DOMAIN}/sweep-status"
SWEEP_CANCEL_ANNOTATION = f"{LABEL_DOMAIN}/sweep-cancel"
SWEEP_EXTEND_ANNOTATION = f"{LABEL_DOMAIN}/sweep-extend"
API_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the client's in-cluster config reads its token


def sweep_controller_job(sweep: str) -> str:
    return f"{sweep}-ctl"  # a sweep name has at most 32 characters, a job's 40
POSTGRES_PORT = 5432
MLFLOW_DATABASE = "mlflow"  # the RDS instance's initial database: MLflow's tracking store
POSTGRES_MAINTENANCE_DATABASE = "postgres"  # the master user's, where bootstrap Jobs connect; closed to PUBLIC


def sweep_database(team: str) -> tuple[str, str]:
    """The team's sweep database and its owner role (PostgreSQL identifiers: no dashes)."""
    ident = team.replace("-", "_")
    return f"optuna_{ident}", f"sweeps_{ident}"
