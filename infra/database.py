"""PostgreSQL on RDS for the MLflow tracking server: private, reachable only from the cluster's nodes, encrypted with
the stack's data key, backed up, its generated password a Pulumi secret (never plain text in the state)."""

from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from trainforge import contract
from trainforge.infra.tags import named
from trainforge.stackconfig import MlflowConfig

ENGINE_VERSION = "16"  # major version; RDS applies minor upgrades in the maintenance window
PORT = contract.POSTGRES_PORT
DATABASE = contract.MLFLOW_DATABASE
# The master user: named `mlflow` by history (renaming it would replace the instance). Since issue 26 it runs only the
# bootstrap Jobs; MLflow itself signs in as `mlflow_server` (platform/manifests/tracking.py).
USERNAME = "mlflow"


class MlflowDatabase(pulumi.ComponentResource):
    instance: aws.rds.Instance
    password: pulumi.Output[str]
    security_group: aws.ec2.SecurityGroup

    def __init__(self, name: str, cfg: MlflowConfig, *, vpc_id: pulumi.Input[str], subnet_ids: Sequence[pulumi.Input[str]],
                 client_security_group_id: pulumi.Input[str], data_key: aws.kms.Key, protect: bool, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:MlflowDatabase", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-db", vpc_id=vpc_id, description="MLflow PostgreSQL: from the cluster's nodes only",
            ingress=[aws.ec2.SecurityGroupIngressArgs(protocol="tcp", from_port=PORT, to_port=PORT, security_groups=[client_security_group_id],
                                                      description="PostgreSQL from the cluster's nodes")],
            tags=named(tags, f"{name}-db"), opts=child)
        subnets = aws.rds.SubnetGroup(f"{name}-db", subnet_ids=subnet_ids, tags=named(tags, f"{name}-db"), opts=child)
        # No special characters: the password travels in a connection URI.
        password = random.RandomPassword(f"{name}-db", length=40, special=False, opts=child)
        self.password = password.result
        self.instance = aws.rds.Instance(
            f"{name}-db", engine="postgres", engine_version=ENGINE_VERSION, instance_class=cfg.instance_class,
            allocated_storage=cfg.storage_gib, storage_type="gp3", storage_encrypted=True, kms_key_id=data_key.arn,
            db_name=DATABASE, username=USERNAME, password=password.result, port=PORT,
            db_subnet_group_name=subnets.name, vpc_security_group_ids=[self.security_group.id], publicly_accessible=False,
            multi_az=cfg.multi_az, backup_retention_period=cfg.backup_retention_days, copy_tags_to_snapshot=True,
            auto_minor_version_upgrade=True, deletion_protection=protect,
            skip_final_snapshot=not protect, final_snapshot_identifier=f"{name}-db-final" if protect else None,
            tags=named(tags, f"{name}-db"), opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["password"]),
        )
        self.register_outputs({"endpoint": self.instance.address})
