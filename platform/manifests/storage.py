"""The stack's FSx for Lustre file system in Kubernetes.

One file system, many namespaces: a PersistentVolume binds exactly one claim, so each team gets its own static PV
(pre-bound by claimRef to the claim `trainforge-fsx` in its namespace), all on the same file system. The file system
itself keeps the teams apart by directory (`/fsx/teams/<team>`, where jobs write) and holds the shared datasets
(`/fsx/datasets`, the S3 data repository). A second, read-only PV per team (`ro` mount) carries the datasets for pods
that should not be able to write them. The StorageClass has no provisioner: a claim can never create a new (costly)
file system by accident; it binds only the PVs made here.
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
