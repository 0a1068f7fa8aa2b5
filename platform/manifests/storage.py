"""The stack's FSx for Lustre file system in Kubernetes.

One file system, many namespaces: a PersistentVolume binds exactly one claim, so each team gets its own static PV
(pre-bound by claimRef to the claim `trainforge-fsx` in its namespace), all on the same file system. The file system
itself keeps the teams apart by directory (`/fsx/teams/<team>`, where jobs write) and holds the shared datasets
(`/fsx/datasets`, the S3 data repository). A second, read-only PV per team (`ro` mount) carries the datasets for pods
that should not be able to write them. The StorageClass has no provisioner: a claim can never create a new (costly)
file system by accident; it binds only the PVs made here.

A new Lustre file system has only a root-owned `/`; pods run as uid 1000 and could not create their team's directory.
So the platform mounts the root once more, in its own namespace (claim `trainforge-fsx-root`), and runs a Job per team that creates
`/fsx/teams/<team>` and gives it to the runtime's uid/gid, mode 0770 (idempotent: a re-run changes nothing). The
team's queue is created after its Job completes, so no job of the team can start before its directory exists.
"""

from __future__ import annotations

from typing import Any

from trainforge import contract

STORAGE_CLASS = "trainforge-fsx-static"
CSI_DRIVER = "fsx.csi.aws.com"
# Block volumes of the platform's own services (Prometheus, Alertmanager). EKS >= 1.30 has no default StorageClass, so
# a claim without a class stays Pending for ever; this one is the cluster's default and is encrypted with the stack's key.
BLOCK_STORAGE_CLASS = "trainforge-gp3"
EBS_CSI_DRIVER = "ebs.csi.aws.com"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def block_storage_class(kms_key_arn: Any) -> dict[str, Any]:
    """gp3 through the EBS CSI add-on, encrypted with the stack's data key; bound where the pod lands (a volume is in
    one AZ); kept on claim deletion (Prometheus' history survives a reinstall)."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": BLOCK_STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "provisioner": EBS_CSI_DRIVER, "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Retain",
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


def team_directory_script(team: str) -> str:
    """Create the team's directory and give it to the runtime's identity; safe to run again."""
    path = contract.fsx_team_dir(team)
    return (f'set -eu\nmkdir -p "{path}"\nchown {contract.RUNTIME_UID}:{contract.RUNTIME_GID} "{path}"\n'
            f'chmod 0770 "{path}"\n')


def team_directory_job(team: str, image: Any, labels: dict[str, str]) -> dict[str, Any]:
    """One Job per team (adding a team adds only its own), root only as far as chown needs: every capability dropped
    but CHOWN, FOWNER and DAC_OVERRIDE. `labels`: the team's cost labels (the Job's pod runs on the team's account)."""
    container = {"name": "mkdir", "image": image, "command": ["sh", "-c", team_directory_script(team)],
                 "volumeMounts": [{"name": "fsx", "mountPath": contract.FSX_MOUNT_PATH}],
                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                 "securityContext": {"runAsUser": 0, "runAsGroup": 0, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"fsx-dir-{team}", "namespace": DIRECTORY_NAMESPACE, "labels": {**labels, contract.LABEL_TEAM: team}},
            "spec": {"backoffLimit": 6, "template": {"metadata": {"labels": {**labels, contract.LABEL_TEAM: team}}, "spec": {
                "restartPolicy": "OnFailure", "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels), "containers": [container],
                "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": ROOT_CLAIM}}]}}}}


def team_volume(team: str, *, file_system_id: Any, dns_name: Any, mount_name: Any, capacity_gib: int, read_only: bool) -> dict[str, Any]:
    claim = contract.FSX_DATASETS_CLAIM_NAME if read_only else contract.FSX_CLAIM_NAME
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
            "csi": {"driver": CSI_DRIVER, "volumeHandle": file_system_id, "readOnly": read_only,
                    "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name}},
        },
    }
