"""The EKS control plane, the handle the platform layer builds on, and the cluster-wide add-ons."""

from __future__ import annotations

import json
from typing import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from trainforge import contract
from trainforge.stackconfig import ClusterConfig
from trainforge.infra.iam import Role, inline_policy, irsa_role, keyed_by_principal, service_role
from trainforge.infra.tags import named

POLICY = "arn:aws:iam::aws:policy/"
CONTROL_PLANE_LOG_TYPES = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
NODE_POLICIES = [
    POLICY + "AmazonEKSWorkerNodePolicy",
    POLICY + "AmazonEC2ContainerRegistryPullOnly",
    POLICY + "AmazonSSMManagedInstanceCore",  # shell access without SSH keys or open ports
]


@dataclass(frozen=True)
class ClusterHandle:
    """What the layers above need of the cluster: where it is, how to trust its workloads, how to talk to it."""

    name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    oidc_issuer_url: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]
    node_role_arn: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]  # secret
    provider: k8s.Provider  # every Kubernetes object of the platform layer is created through this provider


class Cluster(pulumi.ComponentResource):
    TYPE = "trainforge:infra:Cluster"
    cluster: aws.eks.Cluster
    oidc_provider: aws.iam.OpenIdConnectProvider
    node_role: Role
    kubernetes: k8s.Provider

    def __init__(self, name: str, cfg: ClusterConfig, *, private_subnet_ids: Sequence[pulumi.Input[str]],
                 secrets_key: aws.kms.Key, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        """`name` is the EKS cluster's name."""
        super().__init__(self.TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster_name = name

        role = service_role(f"{name}-control-plane", "eks.amazonaws.com", [POLICY + "AmazonEKSClusterPolicy"],
                            named(tags, f"{name}-control-plane"), self)
        # Envelope encryption needs the control plane to use the secrets key.
        role = inline_policy(f"{name}-secrets-key", role, secrets_key.arn.apply(lambda arn: json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": arn,
                                                    "Action": ["kms:Encrypt", "kms:Decrypt", "kms:DescribeKey", "kms:CreateGrant"]}]})))
        # Created before the cluster so EKS writes into a group with a retention limit (not a forever group).
        log_group = aws.cloudwatch.LogGroup(f"{name}-control-plane-logs", name=f"/aws/eks/{cluster_name}/cluster",
                                            retention_in_days=cfg.log_retention_days,
                                            tags=named(tags, f"/aws/eks/{cluster_name}/cluster"), opts=child)

        access = cfg
        self.cluster = aws.eks.Cluster(
            name, name=cluster_name, role_arn=role.arn, version=access.version,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=private_subnet_ids, endpoint_private_access=access.endpoint_private_access,
                endpoint_public_access=access.endpoint_public_access,
                public_access_cidrs=[str(c) for c in access.public_access_cidrs] or None,
            ),
            # API mode: who may administer the cluster is an AWS resource (access entries), not a ConfigMap. No implicit
            # entry for the creator: the deployer is listed in admin_principal_arns like every admin (an implicit entry
            # plus a listed one for the same principal fails the first deploy with ResourceInUseException).
            access_config=aws.eks.ClusterAccessConfigArgs(authentication_mode="API", bootstrap_cluster_creator_admin_permissions=False),
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=access.support_type),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=secrets_key.arn), resources=["secrets"]),
            enabled_cluster_log_types=CONTROL_PLANE_LOG_TYPES,
            tags=named(tags, cluster_name),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[log_group, *role.ready]),
        )
        self.admin_access: list[pulumi.Resource] = []
        for i, principal in enumerate(access.admin_principal_arns):
            entry_name, adopt = keyed_by_principal(f"{name}-admin", principal, i)
            entry = aws.eks.AccessEntry(entry_name, cluster_name=self.cluster.name, principal_arn=principal,
                                        type="STANDARD", tags=named(tags, entry_name), opts=child.merge(adopt))
            self.admin_access.append(entry)
            self.admin_access.append(aws.eks.AccessPolicyAssociation(
                entry_name, cluster_name=self.cluster.name, principal_arn=principal, policy_arn=CLUSTER_ADMIN_POLICY,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]).merge(adopt),
            ))

        self.oidc_provider = aws.iam.OpenIdConnectProvider(
            f"{name}-oidc", url=self.oidc_issuer_url, client_id_lists=["sts.amazonaws.com"],
            tags=named(tags, f"{name}-oidc"), opts=child,
        )
        self.node_role = service_role(f"{name}-nodes", "ec2.amazonaws.com", NODE_POLICIES, named(tags, f"{name}-nodes"), self)
        # Server-side apply: objects the platform layer shares with controllers (a ClusterQueue Kueue updates, a
        # ConfigMap the budget controller writes) keep each writer's fields instead of being overwritten whole.
        # The API server answers the deployer (one of the admins) only once its access entry and cluster-admin policy
        # exist (API authentication mode, no bootstrap admin): the provider's first call waits for them.
        self.kubernetes = kubernetes_provider(name, self.kubeconfig(), pulumi.ResourceOptions(parent=self, depends_on=self.admin_access))
        self.register_outputs({"cluster_name": self.cluster.name, "endpoint": self.cluster.endpoint,
                               "oidc_provider_arn": self.oidc_provider.arn})

    def handle(self) -> ClusterHandle:
        return ClusterHandle(name=self.cluster.name, endpoint=self.cluster.endpoint, oidc_issuer_url=self.oidc_issuer_url,
                             oidc_provider_arn=self.oidc_provider.arn, node_role_arn=self.node_role.arn,
                             security_group_id=self.security_group_id, kubeconfig=self.kubeconfig(), provider=self.kubernetes)

    @property
    def oidc_issuer_url(self) -> pulumi.Output[str]:
        return self.cluster.identities[0].oidcs[0].issuer

    @property
    def security_group_id(self) -> pulumi.Output[str]:
        """The EKS-created cluster security group; every node carries it."""
        return self.cluster.vpc_config.cluster_security_group_id

    def kubeconfig(self) -> pulumi.Output[str]:
        """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credential inside)."""
        def render(args: list[str]) -> str:
            name, endpoint, ca, region = args
            return json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": name,
                "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca}}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
                "users": [{"name": name, "user": {"exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
                    "args": ["eks", "get-token", "--cluster-name", name, "--region", region]}}}],
            })
        region = self.cluster.arn.apply(lambda arn: arn.split(":")[3])
        return pulumi.Output.secret(pulumi.Output.all(self.cluster.name, self.cluster.endpoint,
                                                      self.cluster.certificate_authority.data, region).apply(render))


# Add-ons that need AWS permissions get them through IRSA, never through the node role.
IRSA_ADDONS = {
    "vpc-cni": ("aws-node", [POLICY + "AmazonEKS_CNI_Policy"]),
    "aws-ebs-csi-driver": ("ebs-csi-controller-sa", [POLICY + "service-role/AmazonEBSCSIDriverPolicy"]),
    # Static provisioning only (the platform binds the stack's one file system): the controller creates and deletes
    # nothing, so it may only describe file systems — not AmazonFSxFullAccess. (Describe* takes no resource scope.)
    "aws-fsx-csi-driver": ("fsx-csi-controller-sa", []),
}
IRSA_INLINE_POLICIES = {
    "aws-fsx-csi-driver": {"Version": "2012-10-17", "Statement": [
        {"Sid": "StaticProvisioning", "Effect": "Allow", "Action": ["fsx:DescribeFileSystems"], "Resource": "*"}]},
}
def ebs_kms_policy(key_arn: str) -> dict:
    """What the EBS CSI driver needs to create and attach volumes encrypted with a customer key (AWS EBS CSI driver
    docs, 'KMS encryption'): grants only for AWS resources, and the data-key operations."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "GrantsForVolumes", "Effect": "Allow", "Action": ["kms:CreateGrant", "kms:ListGrants", "kms:RevokeGrant"],
         "Resource": key_arn, "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}}},
        {"Sid": "EncryptVolumes", "Effect": "Allow", "Resource": key_arn,
         "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]}]}


# Installed before any node joins (nodes need networking to become Ready) ...
NETWORK_ADDONS = ("vpc-cni", "kube-proxy")
# ... and after the system nodes exist (these run Deployments that need a node to become ACTIVE).
WORKLOAD_ADDONS = ("coredns", "aws-ebs-csi-driver", "aws-fsx-csi-driver", "eks-node-monitoring-agent")
ADDON_STAGES = {"network": NETWORK_ADDONS, "workload": WORKLOAD_ADDONS}
SYSTEM_NODES = dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels)
# The add-ons' controllers' tolerations when their configuration names none (what tests/test_day_two.py fits against
# the team nodes): CoreDNS's (v1.11.1-eksbuild schema, printed in terraform-aws-eks docs/faq.md) and the EBS and FSx
# CSI controllers' (their charts' values.yaml: CriticalAddonsOnly, and NoExecute for 300 s). None tolerates a
# NoSchedule taint, so no tenant node takes them even without a selector.
ADDON_DEFAULT_TOLERATIONS = {
    "coredns": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
    "aws-ebs-csi-driver": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                           {"effect": "NoExecute", "operator": "Exists", "tolerationSeconds": 300}],
    "aws-fsx-csi-driver": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                           {"effect": "NoExecute", "operator": "Exists", "tolerationSeconds": 300}],
}
ADDON_CONFIGURATION = {
    # Network policy enforcement in the CNI, so team namespaces can be isolated.
    "vpc-cni": {"enableNetworkPolicy": "true"},
    # CoreDNS on the system nodes (the add-on's schema takes a top-level nodeSelector); two replicas survive a node loss.
    "coredns": {"replicaCount": 2, "nodeSelector": SYSTEM_NODES},
    # The EBS CSI controller holds IRSA over EC2 volumes and the KMS key: system nodes only. Its node DaemonSet tolerates
    # every taint by default (node.tolerateAllTaints: true). The FSx add-on's schema is not published, so its controller
    # is kept off the tenant nodes by their taints alone (its tolerations above) rather than by a key it might refuse.
    "aws-ebs-csi-driver": {"controller": {"nodeSelector": SYSTEM_NODES}},
    # Node auto repair sees GPU faults (XID errors, NVLink, EFA) only through these agents, so they run on every node:
    # GPU, spot and team CPU nodes are tainted, hence a toleration of every taint. The DCGM agent's default is none
    # (eks-node-monitoring-agent values.yaml `dcgmAgent.tolerations: []`): it would never run on a GPU node.
    "eks-node-monitoring-agent": {"nodeAgent": {"tolerations": [{"operator": "Exists"}]},
                                  "dcgmAgent": {"tolerations": [{"operator": "Exists"}]}},
}


class Addons(pulumi.ComponentResource):
    """A set of EKS add-ons installed together: NETWORK_ADDONS before any node joins, WORKLOAD_ADDONS after the
    system nodes exist (two instances, so neither registers anything after its outputs)."""

    addons: list[aws.eks.Addon]

    def __init__(self, name: str, cluster: Cluster, stage: str, tags: dict[str, str], *,
                 after: Sequence[pulumi.Resource] | None = None, volume_key: aws.kms.Key | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        """`name` prefixes each add-on's resources (the cluster's name); `stage` is a key of ADDON_STAGES; `volume_key`
        is the customer key EBS volumes are encrypted with (the EBS CSI driver must be allowed to use it)."""
        super().__init__("trainforge:infra:Addons", f"{name}-{stage}-addons", None, opts)
        self._name, self._cluster, self._tags, self._volume_key = name, cluster, tags, volume_key
        self.addons = [self._addon(a, after or []) for a in ADDON_STAGES[stage]]
        self.register_outputs({"addons": [a.addon_name for a in self.addons]})

    def _addon(self, addon: str, depends_on: Sequence[pulumi.Resource]) -> aws.eks.Addon:
        role_arn = None
        if addon in IRSA_ADDONS:
            service_account, policies = IRSA_ADDONS[addon]
            role = irsa_role(
                f"{self._name}-{addon}", oidc_provider_arn=self._cluster.oidc_provider.arn,
                oidc_issuer_url=self._cluster.oidc_issuer_url, namespace=contract.NAMESPACE_KUBE_SYSTEM, service_account=service_account,
                policy_arns=policies, tags=named(self._tags, f"{self._name}-{addon}"), parent=self,
            )
            if addon in IRSA_INLINE_POLICIES:
                role = inline_policy(f"{self._name}-{addon}", role, json.dumps(IRSA_INLINE_POLICIES[addon]))
            if addon == "aws-ebs-csi-driver" and self._volume_key is not None:
                role = inline_policy(f"{self._name}-{addon}-kms", role, self._volume_key.arn.apply(lambda arn: json.dumps(ebs_kms_policy(arn))))
            role_arn = role.arn
            depends_on = [*depends_on, *role.ready]
        config = ADDON_CONFIGURATION.get(addon)
        return aws.eks.Addon(
            f"{self._name}-{addon}", cluster_name=self._cluster.cluster.name, addon_name=addon,
            service_account_role_arn=role_arn, configuration_values=json.dumps(config) if config else None,
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
            tags=named(self._tags, f"{self._name}-{addon}"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on),
        )


def kubernetes_provider(cluster_name: str, kubeconfig: pulumi.Input[str], opts: pulumi.ResourceOptions) -> k8s.Provider:
    """The provider every Kubernetes object goes through, the platform stack's and each team stack's alike (the same name and
    inputs: a team moved out of the platform stack keeps its provider, so its objects are not replaced)."""
    return k8s.Provider(f"{cluster_name}-kubernetes", kubeconfig=kubeconfig, enable_server_side_apply=True, opts=opts)
