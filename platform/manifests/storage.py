"""The stack's FSx for Lustre file system in Kubernetes, one team's directory per team.

One file system, many namespaces, no team able to reach another's files:
- A team's read-write PV (pre-bound to the claim `trainforge-fsx` in its namespace) mounts only the file system's
  `teams/<team>` directory (a Lustre fileset mount: `<dns>@tcp:/<mountname>/teams/<team>`). Pods see it at
  `/fsx/teams/<team>`; nothing above it is reachable from a team pod (mounting needs CAP_SYS_ADMIN, which Pod Security
  `baseline` forbids).
- Its read-only PV (`trainforge-datasets`) mounts only the data repository's directory, with `ro`, at `/fsx/datasets`.
  The association does not export (stack config refuses it for the datasets bucket): no path leads from a job to the
  bucket.
- The directory belongs to the team's own POSIX identity (`contract.team_posix_id`), mode 0770, and team pods are
  admitted only as that identity (platform/manifests/guardrails.py): a second lock if a mount were ever wrong.
Each PV has its own volumeHandle: the kubelet names a CSI volume by driver and handle, and two PVs of one handle in a
pod would be taken for one volume (aws-fsx-csi-driver issue #328); the driver reads only dnsname/mountname.

A new Lustre file system has only a root-owned `/`. So the platform mounts the root once more, in its own namespace
(claim `trainforge-fsx-root`), and runs a Job per team that creates `teams/<team>` for the team's identity and the
datasets directory (idempotent: a re-run changes nothing). The team's queue and access are created after its Job
completes, so no job of the team can start before its directory exists. The StorageClass has no provisioner: a claim
can never create a new (costly) file system by accident; it binds only the PVs made here.

Each team's files may hold at most its FSx quota (`fsx_quota_gib`, default `fsx.team_quota_gib`): a Lustre group
quota on the team's gid, which every file its pods write carries. A Job per team and quota in kube-system (setting a
quota takes CAP_SYS_ADMIN, which only a system namespace admits) runs `lfs setquota` from the FSx CSI driver's image
on the root mounted there once more (claim `fsx-root-quota`). The stack refuses quotas that together exceed the file
system, so a team within its quota always finds room.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trainforge import contract, versions

STORAGE_CLASS = "trainforge-fsx-static"
CSI_DRIVER = "fsx.csi.aws.com"
# Block volumes of the platform's own services (Prometheus, Alertmanager). EKS >= 1.30 has no default StorageClass, so
# a claim without a class stays Pending for ever; this one is the cluster's default and is encrypted with the stack's key.
BLOCK_STORAGE_CLASS = "trainforge-gp3"
EBS_CSI_DRIVER = "ebs.csi.aws.com"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def block_storage_class(kms_key_arn: Any) -> dict[str, Any]:
    """gp3 through the EBS CSI add-on, encrypted with the stack's data key; bound where the pod lands (a volume is in
    one AZ). A volume goes with its claim (Delete): a StatefulSet's claims outlive a chart's reinstall, so Prometheus'
    history survives that anyway, and a destroyed environment leaves no encrypted volume billed with no cluster. (A
    stack deployed with Retain gets the class replaced once: a class's reclaim policy is immutable; the volumes it
    made keep their own.)"""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": BLOCK_STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "provisioner": EBS_CSI_DRIVER, "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete",
            "allowVolumeExpansion": True,
            "parameters": {"type": "gp3", "encrypted": "true", "kmsKeyId": kms_key_arn, "csi.storage.k8s.io/fstype": "ext4"}}


def storage_class() -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate", "reclaimPolicy": "Retain"}


ROOT_CLAIM = "trainforge-fsx-root"
DIRECTORY_NAMESPACE = contract.NAMESPACE_SYSTEM  # not a team namespace: Kueue suspends queue-less Jobs there


def root_volume(*, file_system_id: Any, dns_name: Any, mount_name: Any, capacity_gib: int) -> list[dict[str, Any]]:
    """The file system's root, pre-bound to the platform's own claim (for the directory Jobs only)."""
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": ROOT_CLAIM},
          "spec": {"capacity": {"storage": f"{capacity_gib}Gi"}, "accessModes": ["ReadWriteMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS, "mountOptions": ["flock"],
                   "claimRef": {"namespace": DIRECTORY_NAMESPACE, "name": ROOT_CLAIM},
                   "csi": {"driver": CSI_DRIVER, "volumeHandle": file_system_id,
                           "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name}}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": ROOT_CLAIM, "namespace": DIRECTORY_NAMESPACE},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS, "volumeName": ROOT_CLAIM,
                      "resources": {"requests": {"storage": f"{capacity_gib}Gi"}}}}
    return [pv, claim]


QUOTA_NAMESPACE = contract.NAMESPACE_KUBE_SYSTEM  # setting a Lustre quota takes CAP_SYS_ADMIN: a system namespace's
QUOTA_ROOT_CLAIM = "fsx-root-quota"


def quota_root_volume(*, file_system_id: Any, dns_name: Any, mount_name: Any, capacity_gib: int) -> list[dict[str, Any]]:
    """The file system's root once more, pre-bound to a claim in the quota Jobs' namespace (a claim is namespaced)."""
    pv, claim = root_volume(file_system_id=file_system_id, dns_name=dns_name, mount_name=mount_name, capacity_gib=capacity_gib)
    pv["metadata"]["name"] = QUOTA_ROOT_CLAIM
    pv["spec"]["claimRef"] = {"namespace": QUOTA_NAMESPACE, "name": QUOTA_ROOT_CLAIM}
    pv["spec"]["csi"]["volumeHandle"] = _join(file_system_id, f"::{QUOTA_ROOT_CLAIM}")  # its own, as every PV here
    claim["metadata"] = {"name": QUOTA_ROOT_CLAIM, "namespace": QUOTA_NAMESPACE}
    claim["spec"]["volumeName"] = QUOTA_ROOT_CLAIM
    return [pv, claim]


def quota_command(team: str, gib: int) -> list[str]:
    """`lfs setquota` of the team's group: a hard block limit in KiB (lfs's unit without a suffix), no soft limit, no
    inode limit. FSx enforces group quotas on every file system; files a team's pods write carry its gid."""
    return ["lfs", "setquota", "-g", str(contract.team_posix_id(team)), "-b", "0", "-B", str(gib * 1024 * 1024),
            "-i", "0", "-I", "0", contract.FSX_MOUNT_PATH]


def team_quota_job(team: str, gib: int, labels: dict[str, str]) -> dict[str, Any]:
    """One Job per team and quota (its name carries the quota: a changed quota is a new Job, run once): sets the group
    quota, then prints it (`lfs quota`) for the Job's log. Root with CAP_SYS_ADMIN alone (Lustre's client checks it for
    Q_SETQUOTA, llite quotactl_ioctl), on a system node."""
    digest = hashlib.sha256(" ".join(quota_command(team, gib)).encode()).hexdigest()[:8]
    mount = [{"name": "fsx", "mountPath": contract.FSX_MOUNT_PATH}]
    security = {"runAsUser": 0, "runAsGroup": 0, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    resources = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}

    def container(name: str, command: list[str]) -> dict[str, Any]:
        return {"name": name, "image": versions.FSX_QUOTA_JOB_IMAGE, "command": command, "volumeMounts": mount,
                "resources": resources, "securityContext": security}
    show = ["lfs", "quota", "-h", "-g", str(contract.team_posix_id(team)), contract.FSX_MOUNT_PATH]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"fsx-quota-{team}-{digest}", "namespace": QUOTA_NAMESPACE, "labels": {**labels, contract.LABEL_TEAM: team}},
            "spec": {"backoffLimit": 6, "template": {"metadata": {"labels": {**labels, contract.LABEL_TEAM: team}}, "spec": {
                "restartPolicy": "OnFailure", "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels),
                "initContainers": [container("setquota", quota_command(team, gib))], "containers": [container("show", show)],
                "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": QUOTA_ROOT_CLAIM}}]}}}}


def team_directory_script(team: str, datasets_path: str) -> str:
    """Create the team's directory for the team's identity (and the datasets directory its read-only PV mounts, the
    root's); safe to run again."""
    mount = contract.FSX_MOUNT_PATH
    path = f"{mount}/{contract.FSX_TEAMS_DIR}/{team}"
    posix = contract.team_posix_id(team)
    return (f'set -eu\nmkdir -p "{mount}{datasets_path}"\nmkdir -p "{path}"\nchown {posix}:{posix} "{path}"\n'
            f'chmod 0770 "{path}"\n')


def team_directory_job(team: str, labels: dict[str, str], datasets_path: str) -> dict[str, Any]:
    """One Job per team (adding a team adds only its own), root only as far as chown needs: every capability dropped
    but CHOWN, FOWNER and DAC_OVERRIDE. `labels`: the team's cost labels (the Job's pod runs on the team's account)."""
    container = {"name": "mkdir", "image": versions.DIRECTORY_JOB_IMAGE, "command": ["sh", "-c", team_directory_script(team, datasets_path)],
                 "volumeMounts": [{"name": "fsx", "mountPath": contract.FSX_MOUNT_PATH}],
                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                 "securityContext": {"runAsUser": 0, "runAsGroup": 0, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"fsx-dir-{team}", "namespace": DIRECTORY_NAMESPACE, "labels": {**labels, contract.LABEL_TEAM: team}},
            "spec": {"backoffLimit": 6, "template": {"metadata": {"labels": {**labels, contract.LABEL_TEAM: team}}, "spec": {
                "restartPolicy": "OnFailure", "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels), "containers": [container],
                "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": ROOT_CLAIM}}]}}}}


def team_volumes(team: str, *, file_system_id: Any, dns_name: Any, mount_name: Any, capacity_gib: int,
                 datasets_path: str) -> list[dict[str, Any]]:
    """A team's two volumes: its own directory, read-write, and the datasets, read-only."""
    return [team_volume(team, file_system_id=file_system_id, dns_name=dns_name, mount_name=mount_name, capacity_gib=capacity_gib,
                        read_only=read_only, datasets_path=datasets_path) for read_only in (False, True)]


def team_volume(team: str, *, file_system_id: Any, dns_name: Any, mount_name: Any, capacity_gib: int, read_only: bool,
                datasets_path: str) -> dict[str, Any]:
    """The team's directory (read-write) or the datasets (read-only), each a fileset of the one file system."""
    claim = contract.FSX_DATASETS_CLAIM_NAME if read_only else contract.FSX_CLAIM_NAME
    directory = datasets_path if read_only else f"/{contract.FSX_TEAMS_DIR}/{team}"
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"{claim}-{team}", "labels": {contract.LABEL_TEAM: team}},
        "spec": {
            "capacity": {"storage": f"{capacity_gib}Gi"},
            "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",  # deleting a claim never deletes data
            "storageClassName": STORAGE_CLASS,
            "mountOptions": ["flock", "ro"] if read_only else ["flock"],
            "claimRef": {"namespace": contract.namespace_name(team), "name": claim},
            "csi": {"driver": CSI_DRIVER, "volumeHandle": _join(file_system_id, f"::{claim}-{team}"), "readOnly": read_only,
                    "volumeAttributes": {"dnsname": dns_name, "mountname": _join(mount_name, directory)}},
        },
    }


def _join(output: Any, suffix: str) -> Any:
    """`output` + `suffix`, for a plain string (tests, plan) or a Pulumi output alike."""
    if isinstance(output, str):
        return output + suffix
    return output.apply(lambda value: f"{value}{suffix}")
