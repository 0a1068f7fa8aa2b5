"""Render a job spec as a Kubeflow Trainer v2 TrainJob (default) or a training-operator v1 PyTorchJob.

Both carry the same pod: GPUs, EFA devices, node selection, tolerations and grace period from the job's
`Placement` (decided once, trainer/placement.py, and charged by admission), /dev/shm in memory, the FSx claim,
Kueue queue and priority labels, cost labels, and the training service account (the team's IRSA role).
"""

from __future__ import annotations

import json

from pathlib import PurePosixPath
from typing import Any, Literal

from trainforge import contract, run_tags
from trainforge.trainer.placement import Placement
from trainforge.trainer.spec import JobSpec, task_arg_path

Kind = Literal["trainjob", "pytorchjob"]
CONTAINER = {"trainjob": contract.TRAINJOB_CONTAINER, "pytorchjob": "pytorch"}  # the container name each controller expects
def job_paths(spec: JobSpec) -> dict[str, str]:
    return contract.fsx_job_paths(spec.team, spec.name)


def runtime_args(spec: JobSpec, *, output_dir: str | None = None, checkpoint_dir: str | None = None,
                 tracking_uri: str | None = contract.MLFLOW_TRACKING_URI, metrics_port: int | None = contract.METRICS_PORT,
                 termination_grace_s: int) -> list[str]:
    """The runtime's --set arguments: identity, task, paths, checkpointing, tracking, hyperparameters.

    Defaults are the cluster's (FSx paths, in-cluster MLflow, the metrics port); the local backend passes its own.
    The preemption window is the pods' grace period less the contract's margin, so the two cannot drift."""
    paths = job_paths(spec)
    values: dict[str, Any] = {
        "job_id": spec.name, "team": spec.team, "output_dir": output_dir or paths["output_dir"],
        "checkpoint.dir": checkpoint_dir or paths["checkpoint_dir"], "checkpoint.interval_steps": spec.checkpoint.interval_steps,
        "checkpoint.keep_last": spec.checkpoint.keep_last,
        "checkpoint.preemption_grace_s": contract.preemption_window_s(termination_grace_s),
        "tracking.experiment": spec.tracking.experiment,
    }
    if tracking_uri:
        values["tracking.uri"] = tracking_uri
    if metrics_port is not None:
        values["metrics.port"] = metrics_port
    if spec.entry.task:
        values["task"] = spec.entry.task
        values.update({task_arg_path(k): v for k, v in spec.entry.args.items()})
    if spec.checkpoint.s3_uri:
        values["checkpoint.s3_uri"] = spec.checkpoint.s3_uri
    if spec.checkpoint.start_from:
        # The other job's checkpoints beside this one's, in the same team's jobs directory (local home or FSx).
        own = PurePosixPath(values["checkpoint.dir"])
        values["checkpoint.start_from"] = str(own.parent.parent / spec.checkpoint.start_from / own.name)
    # Quoted: the runtime reads each value as YAML, and a trial number is text here, not an int.
    values.update({f"tracking.lineage.{k}": json.dumps(v) for k, v in spec.tracking.lineage.items()})
    values.update(dotted(spec.hyperparameters))
    if spec.sweep:
        values.update(dotted({"sweep": spec.sweep}))
    return [a for k, v in values.items() for a in ("--set", f"{k}={_yaml_scalar(v)}")]


def dotted(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"sweep": {"study": "s"}} -> {"sweep.study": "s"}: the runtime's --set takes one scalar per dotted key."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def image(spec: JobSpec) -> str:
    """The spec's image (the CLI fills in the stack's before rendering), else the public default."""
    return spec.image or contract.DEFAULT_RUNTIME_IMAGE


def labels(spec: JobSpec, cost_centre: str | None) -> dict[str, str]:
    out = {contract.LABEL_JOB: spec.name, contract.LABEL_TEAM: spec.team,
           contract.KUEUE_QUEUE_LABEL: contract.queue_name(spec.team),
           contract.KUEUE_PRIORITY_LABEL: contract.priority_class_name(spec.priority)}
    if cost_centre:
        out[contract.LABEL_COST_CENTRE] = contract.label_value(cost_centre)
    if spec.sweep:
        out[contract.SWEEP_NAME_LABEL] = contract.label_value(str(spec.sweep.get("controller") or spec.sweep.get("study", "")))
    if is_sweep_controller(spec):
        out[contract.SWEEP_ROLE_LABEL] = contract.SWEEP_CONTROLLER_ROLE  # its pods' egress to the API server selects it
    return out


def pod_labels(spec: JobSpec, cost_centre: str | None) -> dict[str, str]:
    """The job's labels minus Kueue's: those belong on the job object, which Kueue admits as a whole."""
    out = labels(spec, cost_centre)
    del out[contract.KUEUE_QUEUE_LABEL], out[contract.KUEUE_PRIORITY_LABEL]
    return out


def resources(spec: JobSpec, where: Placement) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory,
                               contract.RESOURCE_EPHEMERAL_STORAGE: spec.resources.ephemeral_storage, **where.extended_resources()}
    return {"limits": dict(amounts), "requests": dict(amounts)}


def pod_placement(spec: JobSpec, where: Placement) -> dict[str, Any]:
    """nodeSelector, affinity, tolerations, service account, identity, volumes: the parts of the pod both kinds share.
    (The grace period is not here: a TrainJob takes it from its ClusterTrainingRuntime, a PyTorchJob from its pod
    template.)"""
    affinity = where.node_affinity()
    return {
        "nodeSelector": where.node_selector(),
        **({"affinity": affinity} if affinity else {}),
        "tolerations": where.tolerations(),
        "serviceAccountName": contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT if is_sweep_controller(spec) else contract.TRAINING_SERVICE_ACCOUNT,
        "securityContext": pod_identity(spec.team),
        "volumes": [
            # NCCL and DataLoader workers share tensors through /dev/shm; the container default is 64 MiB.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.memory}},
            # The image's home belongs to its build user; the team's identity gets a home of its own (caches).
            {"name": "home", "emptyDir": {"sizeLimit": HOME_SIZE}},
            {"name": "fsx", "persistentVolumeClaim": {"claimName": contract.FSX_CLAIM_NAME}},
            {"name": "datasets", "persistentVolumeClaim": {"claimName": contract.FSX_DATASETS_CLAIM_NAME, "readOnly": True}},
            *sweep_database_volume(spec),
            *api_token_volume(spec),
        ],
    }


def is_sweep_controller(spec: JobSpec) -> bool:
    """A cluster sweep's controller (trainer/sweeps/cluster.py): the one job that talks to the API server."""
    return bool(spec.sweep and spec.sweep.get("controller"))


API_TOKEN_VOLUME = "api-token"


def api_token_volume(spec: JobSpec) -> list[dict[str, Any]]:
    """The controller's API token, projected where the client's in-cluster configuration reads it (the runtimes mount
    no token; its ServiceAccount does not automount one), short-lived and renewed by the kubelet."""
    if not is_sweep_controller(spec):
        return []
    return [{"name": API_TOKEN_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]


SWEEP_DATABASE_VOLUME = "sweep-database"


def sweep_database_volume(spec: JobSpec) -> list[dict[str, Any]]:
    """A sweep trial reports to its team's study database: the URL (with a password) stays in the team's Secret, mounted
    read-only as one file (0444: no fsGroup, and the pod's one identity is the team's)."""
    if not spec.sweep:
        return []
    return [{"name": SWEEP_DATABASE_VOLUME, "secret": {
        "secretName": contract.SWEEP_STORAGE_SECRET, "defaultMode": 0o444,
        "items": [{"key": contract.SWEEP_STORAGE_KEY, "path": contract.SWEEP_STORAGE_KEY}]}}]


HOME = "/home/trainforge"
HOME_SIZE = "20Gi"


def pod_identity(team: str) -> dict[str, Any]:
    """The pod runs as its team's own POSIX identity, the owner of its FSx directory (the admission policy refuses any
    other); never root. Its groups are that gid alone: `Strict` keeps an image's /etc/group from adding another team's
    gid (and with it that team's FSx directory) to the process (Kubernetes 1.33+, containerd 2.0+ on the node)."""
    posix = contract.team_posix_id(team)
    return {"runAsUser": posix, "runAsGroup": posix, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
            "supplementalGroupsPolicy": contract.SUPPLEMENTAL_GROUPS_POLICY}


def volume_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    """The team's directory where the job paths point, the datasets read-only beside it; nothing else of the file
    system."""
    return [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "home", "mountPath": HOME},
            {"name": "fsx", "mountPath": contract.fsx_team_dir(spec.team)},
            {"name": "datasets", "mountPath": contract.FSX_DATASETS_MOUNT, "readOnly": True},
            *({"name": SWEEP_DATABASE_VOLUME, "mountPath": contract.SWEEP_STORAGE_DIR, "readOnly": True} for _ in sweep_database_volume(spec)),
            *({"name": API_TOKEN_VOLUME, "mountPath": contract.API_TOKEN_DIR, "readOnly": True} for _ in api_token_volume(spec))]


def node_price(spec: JobSpec, where: Placement) -> float | None:
    """USD per node-hour as submitted (spot-fallback at on-demand, the worst case), in the stack's region."""
    from trainforge.pricing import PriceUnknown, price_table
    if where.instance_type is None:
        return None
    table = price_table()
    try:
        return table.hourly(where.instance_type, spec.capacity, where.region or table.regions[0])
    except PriceUnknown:
        return None


def env(spec: JobSpec, where: Placement) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "TRAINFORGE_JOB_ID", "value": spec.name}, {"name": "TRAINFORGE_TEAM", "value": spec.team}, {"name": "HOME", "value": HOME},
           {"name": "TRAINFORGE_IMAGE", "value": image(spec)}, {"name": "MLFLOW_TRACKING_URI", "value": contract.MLFLOW_TRACKING_URI},
           {"name": "MLFLOW_EXPERIMENT_NAME", "value": run_tags.team_experiment(spec.team, spec.tracking.experiment)}]
    if spec.checkpoint.s3_uri:
        out.append({"name": "TRAINFORGE_CHECKPOINT_S3_URI", "value": spec.checkpoint.s3_uri})
    out += [{"name": k, "value": v} for k, v in command_env(spec).items()]
    price = node_price(spec, where)
    if price is not None:
        out.append({"name": contract.NODE_PRICE_ENV, "value": f"{price:.4f}"})
    out += [{"name": k, "value": v} for k, v in efa_env(where).items()]
    # torchrun waits for the workers' emergency checkpoint until just before the kubelet's SIGKILL, not its own 30 s.
    out += [{"name": k, "value": v} for k, v in contract.torchrun_environment(where.termination_grace_s).items()]
    if where.gpus_per_node:
        out.append({"name": contract.GPUS_PER_NODE_ENV, "value": str(where.gpus_per_node)})
    out.append({"name": contract.NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    for variable, key in (("MLFLOW_TRACKING_USERNAME", contract.MLFLOW_USERNAME_KEY), ("MLFLOW_TRACKING_PASSWORD", contract.MLFLOW_PASSWORD_KEY)):
        # The team's MLflow user: the server admits nobody else to the team's experiments.
        out.append({"name": variable, "valueFrom": {"secretKeyRef": {"name": contract.MLFLOW_SECRET, "key": key}}})
    return out


def efa_env(where: Placement) -> dict[str, str]:
    """libfabric's settings for NCCL over EFA, only where the pod gets EFA devices: the EFA provider, and GPUDirect
    RDMA only on types that have it (catalog `efa_rdma`; told to use it on g5/g6, libfabric fails). Elsewhere NCCL
    uses its own transports (NVLink within a node, sockets between)."""
    if not where.efa_devices_per_node or where.instance is None:
        return {}
    return {"FI_PROVIDER": "efa", **({"FI_EFA_USE_DEVICE_RDMA": "1"} if where.instance.efa_rdma else {})}


def command_env(spec: JobSpec) -> dict[str, str]:
    """What an `entry.command` job gets of its spec besides its command: the hyperparameters, as JSON."""
    if not spec.entry.command:
        return {}
    return {contract.HYPERPARAMETERS_ENV: json.dumps(spec.hyperparameters, sort_keys=True)}


LAUNCHER = ["python", "-m", "trainforge.trainer.launch"]


def rank_command(user_command: list[str]) -> list[str]:
    """torchrun's arguments for an `entry.command` job: every rank runs the command under a wrapper that records
    its exit code, so a user's crash (1-127) fails fast and a kill or preemption (>= 128) is retried."""
    return ["-m", "trainforge.trainer.launch", "--rank", "--", *user_command]


def command(spec: JobSpec) -> list[str]:
    # The launcher runs torchrun and exits with the contract's code (torchrun alone always exits 1, which the
    # restart rules would read as a user error). torchrun reads nodes, processes per node, rank and rendezvous
    # from the PET_* variables both controllers set.
    target = rank_command(spec.entry.command) if spec.entry.command else ["-m", "trainforge.trainer.runtime"]
    return [*LAUNCHER, "--", *target]


def args(spec: JobSpec, where: Placement) -> list[str]:
    return [] if spec.entry.command else runtime_args(spec, termination_grace_s=where.termination_grace_s)


def metadata(spec: JobSpec, cost_centre: str | None) -> dict[str, Any]:
    return {"name": spec.name, "namespace": contract.namespace_name(spec.team), "labels": labels(spec, cost_centre)}


def max_runtime_seconds(spec: JobSpec) -> int:
    return int(spec.limits.max_runtime_hours * 3600)


def render_trainjob(spec: JobSpec, where: Placement, cost_centre: str | None = None) -> dict[str, Any]:
    placement = pod_placement(spec, where)
    return {
        "apiVersion": contract.TRAINER_API,
        "kind": "TrainJob",
        "metadata": metadata(spec, cost_centre),
        "spec": {
            "runtimeRef": {"apiGroup": contract.api_group(contract.TRAINER_API), "kind": "ClusterTrainingRuntime", "name": where.training_runtime},
            "activeDeadlineSeconds": max_runtime_seconds(spec),
            "trainer": {
                "image": image(spec), "numNodes": spec.workers.nodes, "numProcPerNode": spec.workers.procs_per_node,
                "command": command(spec), "args": args(spec, where), "env": env(spec, where), "resourcesPerNode": resources(spec, where),
            },
            # Placement and volumes go in through a runtime patch: the TrainJob's trainer section has no field for them.
            "runtimePatches": [{
                "manager": f"{contract.LABEL_DOMAIN}/submitter",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": contract.TRAINJOB_REPLICATED_JOB,
                    "template": {"spec": {"template": {
                        "metadata": {"labels": pod_labels(spec, cost_centre)},
                        "spec": {**placement, "containers": [{"name": CONTAINER["trainjob"], "volumeMounts": volume_mounts(spec)}]},
                    }}},
                }]}}},
            }],
        },
    }


def render_pytorchjob(spec: JobSpec, where: Placement, cost_centre: str | None = None) -> dict[str, Any]:
    template = {
        "metadata": {"labels": pod_labels(spec, cost_centre)},
        "spec": {**pod_placement(spec, where), "terminationGracePeriodSeconds": where.termination_grace_s,
                 "automountServiceAccountToken": False, "containers": [{
            "name": CONTAINER["pytorchjob"], "image": image(spec), "workingDir": contract.IMAGE_WORKDIR, "command": command(spec), "args": args(spec, where), "env": env(spec, where),
            "securityContext": dict(contract.TRAINING_CONTAINER_SECURITY),
            "resources": resources(spec, where), "volumeMounts": volume_mounts(spec),
            "ports": [{"name": contract.METRICS_PORT_NAME, "containerPort": contract.METRICS_PORT}],
        }]},
    }

    def replica(count: int) -> dict[str, Any]:
        # ExitCode: 128-255 (signals, and our "preempted" 143) restart the pod; 1-127 (user errors) fail the job.
        return {"replicas": count, "restartPolicy": "ExitCode", "template": template}

    replicas = {"Master": replica(1)}
    if spec.workers.nodes > 1:
        replicas["Worker"] = replica(spec.workers.nodes - 1)
    return {
        "apiVersion": contract.PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": metadata(spec, cost_centre),
        "spec": {
            "nprocPerNode": str(spec.workers.procs_per_node),
            "runPolicy": {"activeDeadlineSeconds": max_runtime_seconds(spec), "backoffLimit": 20 if spec.capacity != "on-demand" else 3,
                          "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }


def render(spec: JobSpec, where: Placement, kind: Kind = "trainjob", cost_centre: str | None = None) -> dict[str, Any]:
    """The manifest of `spec` placed `where` (trainer/placement.py: decided once, charged by admission)."""
    return {"trainjob": render_trainjob, "pytorchjob": render_pytorchjob}[kind](spec, where, cost_centre)
