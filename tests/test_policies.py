"""The policy pack: every rule passes a compliant resource and fails a violating one with a message that says what to
change (built as the engine presents them: camelCase, provider default tags, unknowns at preview); every shipped stack
passes every mandatory rule; and the pack runs as the Pulumi CLI runs it, over the analyzer protocol."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from support.repo import REPO, STACK_FILES
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy
from pulumi_policy.policy import UnknownValueError

from trainforge import catalog, contract
from trainforge.policies.pack import POLICIES, rules_table
from trainforge.policies.registry import StackResource, check_resource, check_stack, rules
from trainforge.policies.stack import BUCKET_GUARDS

RULES = rules()
BY_NAME = {r.name: r for r in RULES}
TAGS = {k: "x" for k in contract.REQUIRED_COST_TAGS}
PROVIDER = {"region": "us-east-1", "defaultTags": json.dumps({"tags": TAGS})}  # provider config arrives JSON-encoded
LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"


def lt(**changes):
    props = {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
             "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true"}}],
             "tagSpecifications": [{"resourceType": r, "tags": TAGS} for r in ("instance", "volume", "network-interface")]}
    props.update(changes)
    return props


def ng(**changes):
    props = {"amiType": "AL2023_x86_64_NVIDIA", "instanceTypes": ["g6.xlarge", "g5.xlarge"], "capacityType": "SPOT",
             "taints": [{"key": contract.TAINT_GPU, "value": "present", "effect": "NO_SCHEDULE"}], "scalingConfig": {"maxSize": 8}}
    props.update(changes)
    return props


p5 = catalog.lookup("p5.48xlarge")
EFA_INTERFACES = [{"networkCardIndex": s.network_card_index, "deviceIndex": s.device_index, "interfaceType": s.interface_type}
                  for s in catalog.efa_interface_layout(p5)]
POD = {"containers": [{"name": "node", "image": "x"}]}

def team_pv(team, *, claimed_by, read_only=False):
    """The program's own team volume (platform/manifests/storage.py), its claim moved to `claimed_by`'s namespace."""
    from trainforge.platform.manifests.storage import team_volume
    pv = team_volume(team, file_system_id="fs-1", dns_name="fs-1.fsx", mount_name="abcd", capacity_gib=1200, read_only=read_only,
                     datasets_path="/datasets")
    pv["spec"]["claimRef"]["namespace"] = contract.namespace_name(claimed_by)
    return pv


# rule -> (resource type, compliant props, violating props, the fix the message must name)
RESOURCE_CASES = {
    "cost-tags": ("aws:ec2/natGateway:NatGateway", {"tags": {"Name": "nat"}}, {"tags": {"Name": "nat"}}, "Fix: tag it"),
    "launch-templates-tag-what-they-create": (LT, lt(), lt(tagSpecifications=[{"resourceType": "instance", "tags": TAGS}]), "tag_specifications"),
    "imdsv2-with-hop-limit-one": (LT, lt(), lt(metadataOptions={"httpTokens": "optional", "httpPutResponseHopLimit": 2}), "http_tokens"),
    "node-volumes-encrypted-and-interfaces-private": (LT, lt(), lt(networkInterfaces=[{"associatePublicIpAddress": "true"}]),
                                                      "associate_public_ip_address"),
    "subnets-assign-no-public-ips": ("aws:ec2/subnet:Subnet", {"mapPublicIpOnLaunch": False}, {"mapPublicIpOnLaunch": True}, "map_public_ip_on_launch"),
    "eks-secrets-encrypted": ("aws:eks/cluster:Cluster", {"encryptionConfig": {"resources": ["secrets"], "provider": {"keyArn": "arn:k"}}},
                              {}, "encryption_config"),
    "cluster-endpoint-not-open-to-the-world": ("aws:eks/cluster:Cluster", {"vpcConfig": {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.0/24"]}},
                                               {"vpcConfig": {"endpointPublicAccess": True}}, "public_access_cidrs"),
    "kms-keys-rotate": ("aws:kms/key:Key", {"enableKeyRotation": True}, {"enableKeyRotation": False}, "enable_key_rotation"),
    "s3-encrypted-with-kms": ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                              {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": "arn:k"}}]},
                              {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]}, "kms_master_key_id"),
    "s3-public-access-blocked": ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
                                 dict.fromkeys(("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"), True),
                                 {**dict.fromkeys(("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls"), True), "restrictPublicBuckets": False},
                                 "all four"),
    "s3-requires-tls": ("aws:s3/bucketPolicy:BucketPolicy",
                        {"policy": json.dumps({"Statement": [{"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})},
                        {"policy": json.dumps({"Statement": [{"Effect": "Allow", "Action": "s3:GetObject"}]})}, "aws:SecureTransport"),
    "fsx-encrypted": ("aws:fsx/lustreFileSystem:LustreFileSystem", {"deploymentType": "PERSISTENT_2", "kmsKeyId": "arn:k"},
                      {"deploymentType": "PERSISTENT_2"}, "kms_key_id"),
    "rds-encrypted-and-private": ("aws:rds/instance:Instance", {"storageEncrypted": True, "publiclyAccessible": False},
                                  {"storageEncrypted": False, "publiclyAccessible": True}, "publicly_accessible"),
    "gpu-node-groups-tainted-and-allowed": (NG, ng(), ng(taints=[], instanceTypes=["p3.2xlarge", "g6.xlarge"]), "allowedGpuFamilies"),
    "spot-groups-diversified": (NG, ng(), ng(instanceTypes=["g6.xlarge"]), "at least 2 types"),
    "node-group-size-bounded": (NG, ng(), ng(scalingConfig={"maxSize": 500}), "smaller max_size"),
    "region-allowed": ("pulumi:providers:aws", {"region": "us-east-1"}, {"region": "ap-south-1"}, "one of ['us-east-1'"),
    "efa-templates-complete": (LT, lt(networkInterfaces=EFA_INTERFACES, placement={"groupName": "pg"}),
                               lt(networkInterfaces=EFA_INTERFACES[:5]), "placement.group_name"),
    "helm-releases-pinned": ("kubernetes:helm.sh/v3:Release", {"chart": "kueue", "version": "0.19.2"}, {"chart": "kueue", "version": "~0.19"},
                             "an exact version"),
    "no-privileged-pods-outside-system-namespaces": (
        "kubernetes:apps/v1:DaemonSet",
        {"metadata": {"namespace": "kube-system"}, "spec": {"template": {"spec": {**POD, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}}},
        {"metadata": {"namespace": "team-vision"}, "spec": {"template": {"spec": {"containers": [{"name": "x", "securityContext": {"privileged": True}}],
                                                                                  "volumes": [{"name": "h", "hostPath": {"path": "/var"}}]}}}},
        "drop privileged"),
    "team-namespaces-carry-cost-labels": (
        "kubernetes:core/v1:Namespace",
        {"metadata": {"name": "team-a", "labels": {"trainforge.io/team": "a", "trainforge.io/cost-centre": "cc", "trainforge.io/environment": "dev"}}},
        {"metadata": {"name": "team-a", "labels": {"trainforge.io/team": "a"}}}, "label it"),
    # Security regressions (issue 26, item 9): each one injected into an otherwise compliant object.
    "kueue-enforces-queues": (
        "kubernetes:helm.sh/v3:Release",
        {"chart": "kueue", "version": "0.19.2", "values": {"managerConfig": {"controllerManagerConfigYaml":
            "manageJobsWithoutQueueName: true\nmanagedJobsNamespaceSelector: {matchExpressions: [{key: trainforge.io/team, operator: Exists}]}\n"}}},
        {"chart": "kueue", "version": "0.19.2", "values": {"managerConfig": {"controllerManagerConfigYaml": "manageJobsWithoutQueueName: false\n"}}},
        "manageJobsWithoutQueueName: true"),
    "services-stay-inside-the-cluster": (
        "kubernetes:helm.sh/v3:Release", {"chart": "mlflow", "version": "1.11.5", "values": {"service": {"port": 5000}}},
        {"chart": "mlflow", "version": "1.11.5", "values": {"service": {"port": 5000, "type": "LoadBalancer"}}}, "Fix: ClusterIP"),
    "team-namespaces-enforce-pod-security": (
        "kubernetes:core/v1:Namespace",
        {"metadata": {"name": "team-a", "labels": {"trainforge.io/team": "a", "pod-security.kubernetes.io/enforce": "restricted"}}},
        {"metadata": {"name": "team-a", "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}, "enforce: restricted"),
    "team-roles-least-privilege": (
        "kubernetes:rbac.authorization.k8s.io/v1:Role",
        {"metadata": {"namespace": "team-a"}, "rules": [
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["trainforge-sweeps"], "verbs": ["get"]}]},
        {"metadata": {"namespace": "team-a"}, "rules": [{"apiGroups": [""], "resources": ["secrets", "pods/exec"], "verbs": ["get", "create"]},
                                                        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["*"]}]},
        "Fix: remove it"),
    "no-admin-bindings": ("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
                          {"roleRef": {"name": "trainforge-a-queue-reader"}, "subjects": [{"name": "trainforge:team:a"}]},
                          {"roleRef": {"name": "cluster-admin"}, "subjects": [{"name": "trainforge:team:a"}]}, "EKS access policy"),
    "team-network-policies-not-open": (
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
        {"metadata": {"namespace": "team-a"}, "spec": {"ingress": [{"from": [{"podSelector": {}}]}],
                                                       "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                                                           "10.0.0.0/16", "10.100.0.0/16", "172.20.0.0/16"]}}], "ports": [{"port": 443}]}]}},
        {"metadata": {"namespace": "team-a"}, "spec": {"ingress": [{"from": [{"namespaceSelector": {}}]}], "egress": [{}]}}, "name the"),
    # Isolation regressions (issue 37, item 8; tests/test_policy_regressions.py injects each into the prod stack).
    "mlflow-enforces-team-boundaries": (
        "kubernetes:helm.sh/v3:Release",
        {"chart": "mlflow", "version": "1.11.5", "values": {"auth": {"enabled": True, "appName": "trainforge-auth", "defaultPermission": "NO_PERMISSIONS"}}},
        {"chart": "mlflow", "version": "1.11.5", "values": {"auth": {"enabled": True, "appName": "basic-auth", "defaultPermission": "NO_PERMISSIONS"}}},
        "auth.appName: trainforge-auth"),
    "scrapes-bounded-and-unforgeable": (
        "kubernetes:helm.sh/v3:Release",
        {"chart": "dcgm-exporter", "version": "4.8.2", "values": {"serviceMonitor": {"honorLabels": False},
                                                                   "kubernetes": {"enablePodLabels": True, "podLabelAllowlistRegex": ["^app$"]}}},
        {"chart": "dcgm-exporter", "version": "4.8.2", "values": {"serviceMonitor": {"honorLabels": True}, "kubernetes": {"enablePodLabels": True}}},
        "honorLabels: false"),
    "trainer-scrape-unforgeable": (
        "kubernetes:monitoring.coreos.com/v1:PodMonitor",
        {"metadata": {"name": "trainforge-trainers"}, "spec": {"podMetricsEndpoints": [{"honorLabels": False}], "sampleLimit": 2000.0, "labelLimit": 12.0}},
        {"metadata": {"name": "trainforge-trainers"}, "spec": {"podMetricsEndpoints": [{"honorLabels": True}]}}, "honorLabels: false"),
    "team-admission-policies-complete": (
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
        {"kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "trainforge-team-pods"},
         "spec": {"policyName": "trainforge-team-pods", "validationActions": ["Deny"]}},
        {"kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "trainforge-team-pods"},
         "spec": {"policyName": "trainforge-team-pods", "validationActions": ["Audit"]}}, "validationActions: [Deny]"),
    "team-settings-name-the-teams-identity": (
        "kubernetes:core/v1:ConfigMap",
        {"metadata": {"name": "trainforge-team", "namespace": "team-a"}, "data": {"uid": str(contract.team_posix_id("a")), "gid": str(contract.team_posix_id("a"))}},
        {"metadata": {"name": "trainforge-team", "namespace": "team-a"}, "data": {"uid": "0", "gid": str(contract.team_posix_id("a"))}},
        "contract.team_posix_id"),
    "team-directories-private": (
        "kubernetes:batch/v1:Job",
        {"metadata": {"name": "fsx-dir-a", "namespace": "trainforge-system"},
         "spec": {"template": {"spec": {"containers": [{"name": "mkdir", "command": ["sh", "-c", "mkdir -p /fsx/teams/a\nchmod 0770 /fsx/teams/a\n"]}]}}}},
        {"metadata": {"name": "fsx-dir-a", "namespace": "trainforge-system"},
         "spec": {"template": {"spec": {"containers": [{"name": "mkdir", "command": ["sh", "-c", "mkdir -p /fsx/teams/a\nchmod 0777 /fsx/teams/a\n"]}]}}}},
        "chmod 0770"),
    "fsx-never-exports": ("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation", {"s3": {"autoExportPolicy": {"events": []}}},
                          {"s3": {"autoExportPolicy": {"events": ["NEW"]}}}, "no auto_export_policy"),
    "security-groups-closed-to-the-world": (
        "aws:ec2/securityGroup:SecurityGroup",
        {"ingress": [{"protocol": "tcp", "fromPort": 5432, "toPort": 5432, "securityGroups": ["sg-nodes"]}]},
        {"ingress": [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]},
                     {"protocol": "tcp", "fromPort": 5432, "toPort": 5432, "cidrBlocks": ["0.0.0.0/0"]}]}, "never 0.0.0.0/0"),
    "rds-backed-up": ("aws:rds/instance:Instance", {"backupRetentionPeriod": 7}, {"backupRetentionPeriod": 0}, "backup_retention_period"),
    "rds-deletion-protected": ("aws:rds/instance:Instance", {"deletionProtection": True},
                               {"deletionProtection": False, "skipFinalSnapshot": True}, "deletion_protection"),
    "bucket-versioning-enabled": ("aws:s3/bucketVersioning:BucketVersioning", {"versioningConfiguration": {"status": "Enabled"}},
                                  {"versioningConfiguration": {"status": "Suspended"}}, "status = 'Enabled'"),
    "kms-policies-scoped": ("aws:kms/key:Key",
                            {"enableKeyRotation": True, "policy": json.dumps({"Statement": [
                                {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111122223333:root"}, "Action": "kms:*", "Resource": "*"}]})},
                            {"enableKeyRotation": True, "policy": json.dumps({"Statement": [
                                {"Effect": "Allow", "Principal": "*", "Action": "kms:*", "Resource": "*"}]})}, "name the account's principals"),
    "team-volumes-reach-only-their-team": ("kubernetes:core/v1:PersistentVolume", team_pv("a", claimed_by="a"), team_pv("b", claimed_by="a"),
                                           "mount only teams/a"),
}
CONFIG = {"region-allowed": {"allowedRegions": ["us-east-1", "us-west-2"]}}
NO_PROVIDER_TAGS = {"cost-tags"}  # the violating case loses what the provider would add


def sr(resource_type, name, props, deps=()):
    return StackResource(resource_type, name, f"urn:{name}", props, {}, tuple(f"urn:{d}" for d in deps))


def efa_stack(*, fsx_zone="us-east-1a", group_zones=("us-east-1a",), strategy="cluster", self_open=True):
    everything = {"protocol": "-1", "self": self_open, "fromPort": 0, "toPort": 0}
    return [
        sr("aws:ec2/subnet:Subnet", "a", {"availabilityZone": "us-east-1a"}), sr("aws:ec2/subnet:Subnet", "b", {"availabilityZone": "us-east-1b"}),
        sr("aws:ec2/placementGroup:PlacementGroup", "pg", {"strategy": strategy}),
        sr("aws:ec2/securityGroup:SecurityGroup", "efa-sg", {"ingress": [everything], "egress": [everything]}),
        sr(LT, "lt", {"networkInterfaces": EFA_INTERFACES, "placement": {"groupName": "pg"}}, deps=("pg", "efa-sg")),
        sr(NG, "p5", {"labels": {}, "taints": []}, deps=("lt", *("a" if z == "us-east-1a" else "b" for z in group_zones))),
        sr("aws:fsx/lustreFileSystem:LustreFileSystem", "fsx", {}, deps=("a" if fsx_zone == "us-east-1a" else "b",)),
    ]


def flavour_stack(flavour_labels):
    traits = contract.flavour_traits(contract.Flavour.GPU_SPOT)
    return [sr(NG, "spot", {"labels": dict(traits.labels), "taints": [{"key": t.key, "value": t.value, "effect": "NO_SCHEDULE"} for t in traits.taints]}),
            sr("kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor", "f", {"metadata": {"name": "gpu-spot"}, "spec": {
                "nodeLabels": flavour_labels, "nodeTaints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in traits.taints]}})]


def tenancy_stack(*, with_quota: bool):
    ns = "team-vision"
    objects = [sr("aws:iam/role:Role", "role", {"tags": {"team": "vision"}}),
               sr("kubernetes:core/v1:Namespace", ns, {"metadata": {"name": ns, "labels": {"trainforge.io/team": "vision"}}}),
               sr("kubernetes:core/v1:LimitRange", "lr", {"metadata": {"namespace": ns}}),
               sr("kubernetes:networking.k8s.io/v1:NetworkPolicy", "deny", {"metadata": {"namespace": ns},
                                                                           "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}),
               sr("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue", "lq", {"metadata": {"namespace": ns}}),
               sr("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue", "cq", {"metadata": {"name": contract.cluster_queue_name("vision")}})]
    if with_quota:
        objects.append(sr("kubernetes:core/v1:ResourceQuota", "q", {"metadata": {"namespace": ns}, "spec": {"hard": {"requests.nvidia.com/gpu": "8"}}}))
    return objects


def bucket_stack(*guards):
    return [sr("aws:s3/bucket:Bucket", "data", {}), *(sr(t, f"g{i}", {}, deps=("data",)) for i, t in enumerate(guards))]


BUCKET_ARNS = {kind: f"arn:aws:s3:::dev-{kind}" for kind in ("datasets", "checkpoints", "artifacts")}


def team_role_stack(*, widen=None, attach=None, trust="team-vision"):
    """The program's own team role and storage policy (infra/teams.py), with one regression injected."""
    from trainforge.infra.teams import team_policy
    document = json.loads(team_policy(BUCKET_ARNS, "arn:aws:kms:key/data", "vision"))
    if widen:
        widen(document["Statement"])
    trust_policy = {"Statement": [{"Effect": "Allow", "Action": "sts:AssumeRoleWithWebIdentity", "Condition": {"StringEquals": {
        "oidc/id/X:sub": f"system:serviceaccount:{trust}:{contract.TRAINING_SERVICE_ACCOUNT}", "oidc/id/X:aud": "sts.amazonaws.com"}}}]}
    objects = [*(sr("aws:s3/bucket:Bucket", kind, {"arn": arn, "tags": {"purpose": kind}}) for kind, arn in BUCKET_ARNS.items()),
               sr("aws:iam/role:Role", "vision", {"name": "vision-1a2b", "tags": {"team": "vision"}, "assumeRolePolicy": json.dumps(trust_policy)}),
               sr("aws:iam/rolePolicy:RolePolicy", "vision-storage", {"role": "vision-1a2b", "policy": json.dumps(document)}, deps=("vision",))]
    if attach:
        objects.append(sr("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "admin", {"role": "vision-1a2b", "policyArn": attach}))
    return objects


def _read_write_everywhere(statements):
    next(s for s in statements if s.get("Sid") == "ReadWriteOwnPrefix")["Resource"] = [f"{arn}/*" for arn in BUCKET_ARNS.values()]


def team_stack_quota(*, capacity: int):
    """A team stack: its ClusterQueue asks for 8 spot GPUs; its StackReference reads the platform's gpu_capacity."""
    queue = {"spec": {"resourceGroups": [{"flavors": [{"name": "gpu-spot", "resources": [
        {"name": "cpu", "nominalQuota": "512"}, {"name": contract.RESOURCE_GPU, "nominalQuota": 8}]}]}]}}
    return [sr("pulumi:pulumi:StackReference", "prod-platform", {"outputs": {"gpu_capacity": {"gpu-spot": capacity}}}),
            sr("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue", "clusterqueue-team-vision", queue)]


def platform_namespaces_stack(*, deny: bool):
    """The platform's namespaces, each with its default-deny (or, for monitoring, one that governs ingress only)."""
    out = []
    for namespace in (contract.NAMESPACE_KUEUE, contract.NAMESPACE_TRAINER, contract.NAMESPACE_MONITORING, contract.NAMESPACE_MLFLOW,
                      contract.NAMESPACE_OPENCOST, contract.NAMESPACE_SYSTEM):
        out.append(sr("kubernetes:core/v1:Namespace", namespace, {"metadata": {"name": namespace}}))
        types = ["Ingress"] if namespace == contract.NAMESPACE_MONITORING and not deny else ["Ingress", "Egress"]
        out.append(sr("kubernetes:networking.k8s.io/v1:NetworkPolicy", f"{namespace}-default-deny",
                      {"metadata": {"name": "default-deny", "namespace": namespace}, "spec": {"podSelector": {}, "policyTypes": types}}))
    return out


# stack rule -> (compliant resources, violating resources, what the message must say)
STACK_CASES = {
    "platform-namespaces-deny-by-default": (platform_namespaces_stack(deny=True), platform_namespaces_stack(deny=False),
                                            "namespace monitoring has no default-deny NetworkPolicy"),
    "team-quota-within-platform-capacity": (team_stack_quota(capacity=8), team_stack_quota(capacity=4),
                                            "asks for 8 gpu-spot GPUs, but the platform's node groups reach at most 4"),
    "buckets-fully-guarded": (bucket_stack(*BUCKET_GUARDS), bucket_stack(*list(BUCKET_GUARDS)[:2]), "denies plain HTTP"),
    "efa-groups-coherent": (efa_stack(), efa_stack(fsx_zone="us-east-1b"), "put FSx in the EFA group's AZ"),
    "resource-flavours-match-node-groups": (flavour_stack({contract.LABEL_FLAVOUR: "gpu-spot"}),
                                            flavour_stack({contract.LABEL_FLAVOUR: "gpu-spot", "extra": "x"}), "flavour_traits"),
    "teams-have-their-tenancy": (tenancy_stack(with_quota=True), tenancy_stack(with_quota=False), "requests.nvidia.com/gpu"),
    "team-roles-confined": (team_role_stack(), team_role_stack(widen=_read_write_everywhere), "Fix: arn:aws:s3:::dev-checkpoints/teams/vision/*"),
}


def test_every_rule_has_a_case_both_ways():
    assert set(RESOURCE_CASES) | set(STACK_CASES) == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(RESOURCE_CASES))
def test_each_resource_rule_passes_the_compliant_and_fails_the_violating_resource(name):
    resource_type, good, bad, fix = RESOURCE_CASES[name]
    rule, config = BY_NAME[name], CONFIG.get(name)
    assert check_resource(rule, resource_type, good, config=config, provider_props=PROVIDER) == []
    found = check_resource(rule, resource_type, bad, config=config, provider_props={} if name in NO_PROVIDER_TAGS else PROVIDER)
    assert found and any(fix in message for message in found), found


@pytest.mark.parametrize("name", sorted(STACK_CASES))
def test_each_stack_rule_passes_the_compliant_and_fails_the_violating_stack(name):
    good, bad, fix = STACK_CASES[name]
    assert check_stack(BY_NAME[name], good) == []
    found = check_stack(BY_NAME[name], bad)
    assert found and any(fix in message for message, _ in found), found


def test_more_efa_mistakes_are_named():
    messages = [m for m, _ in check_stack(BY_NAME["efa-groups-coherent"], efa_stack(group_zones=("us-east-1a", "us-east-1b"), strategy="spread",
                                                                                    self_open=False))]
    assert any("spans" in m for m in messages) and any("cluster placement group" in m for m in messages)
    assert any("open to itself" in m or "itself" in m for m in messages)


def test_provider_default_tags_count_as_the_resources_tags():
    rule = BY_NAME["cost-tags"]
    assert check_resource(rule, "aws:ec2/natGateway:NatGateway", {"tags": {"Name": "nat"}}, provider_props=PROVIDER) == []
    assert check_resource(rule, "aws:ec2/natGateway:NatGateway", {}, provider_props={}) != []


def test_an_unknown_value_at_preview_is_not_a_violation():
    props = unknown_checking_proxy({"metadataOptions": UNKNOWN_STRING_VALUE})
    with pytest.raises(UnknownValueError):  # the analyzer reports "can't run during preview", not a violation
        check_resource(BY_NAME["imdsv2-with-hop-limit-one"], LT, props)


def test_the_config_changes_what_is_allowed():
    assert check_resource(BY_NAME["node-group-size-bounded"], NG, ng(), config={"maxNodeGroupSize": 4})
    assert check_resource(BY_NAME["spot-groups-diversified"], NG, ng(), config={"minSpotInstanceTypes": 3})
    assert not check_resource(BY_NAME["gpu-node-groups-tainted-and-allowed"], NG, ng(instanceTypes=["p3.2xlarge"]),
                              config={"allowedGpuFamilies": ["p3", "g6"]})


# ---- the shipped stacks ----------------------------------------------------------------------------------------

def stack_resources(evaluation):
    from trainforge.platform.plan.plan import policy_view
    return policy_view(evaluation)


def test_every_shipped_stack_passes_every_mandatory_rule(stack):
    evaluation, _ = stack
    per_resource, whole = stack_resources(evaluation)
    found = []
    for rule in RULES:
        if rule.level.value != "mandatory":
            continue
        if rule.is_stack_rule:
            found += [f"{rule.name}: {m}" for m, _ in check_stack(rule, whole)]
        else:
            for resource_type, name, props, provider in per_resource:
                found += [f"{rule.name} on {name}: {m}" for m in check_resource(rule, resource_type, props, provider_props=provider)]
    assert found == []


def test_a_broken_stack_fails_its_rules(stack):
    evaluation, _ = stack
    per_resource, whole = stack_resources(evaluation)
    (resource_type, name, props, provider) = next(x for x in per_resource if x[0] == LT)
    broken = copy.deepcopy(props)
    broken["metadataOptions"]["httpTokens"] = "optional"
    assert check_resource(BY_NAME["imdsv2-with-hop-limit-one"], resource_type, broken, provider_props=provider)


# ---- the pack as the Pulumi CLI runs it ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def analyzer():
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    process = subprocess.Popen([sys.executable, str(REPO / "policies" / "__main__.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    port = process.stdout.readline().decode().strip()  # the pack prints its port once its server listens
    assert port.isdigit(), process.stderr.read().decode()[-2000:]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    yield analyzer_pb2_grpc.AnalyzerStub(channel)
    channel.close()
    process.kill()
    process.wait()


def _struct(props):
    from google.protobuf import json_format, struct_pb2
    return json_format.ParseDict(json.loads(json.dumps(props, default=str)), struct_pb2.Struct())


def analyze(stub, resource_type, name, props, provider_props=None):
    from pulumi.runtime.proto import analyzer_pb2
    request = analyzer_pb2.AnalyzeRequest(type=resource_type, properties=_struct(props), urn=f"urn:pulumi:dev::trainforge::{resource_type}::{name}",
                                          name=name)
    if provider_props is not None:
        request.provider.CopyFrom(analyzer_pb2.AnalyzerProviderResource(type="pulumi:providers:aws", properties=_struct(provider_props),
                                                                       urn="urn:provider", name="aws"))
    return [(d.policyName, d.message) for d in stub.Analyze(request).diagnostics]


def test_the_pack_lists_every_rule_over_the_analyzer_protocol(analyzer):
    from google.protobuf import empty_pb2
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "trainforge" and {p.name for p in info.policies} == set(BY_NAME) == {p.name for p in POLICIES}


def test_the_pack_reports_bad_resources_and_passes_good_ones(analyzer):
    resource_type, good, bad, _ = RESOURCE_CASES["imdsv2-with-hop-limit-one"]
    assert analyze(analyzer, resource_type, "good", good, PROVIDER) == []
    assert {p for p, _ in analyze(analyzer, resource_type, "bad", bad, PROVIDER)} == {"imdsv2-with-hop-limit-one"}
    assert [p for p, _ in analyze(analyzer, "aws:ec2/natGateway:NatGateway", "nat", {"tags": {"Name": "nat"}})] == ["cost-tags"]


@pytest.mark.parametrize("path", STACK_FILES, ids=[p.name for p in STACK_FILES])
def test_the_pack_passes_every_resource_of_the_shipped_stacks(analyzer, evaluations, path):
    from pulumi.runtime.proto import analyzer_pb2
    evaluation = evaluations(path)
    per_resource, whole = stack_resources(evaluation)
    found, advised = [], set()
    for resource_type, name, props, provider in per_resource:
        request = analyzer_pb2.AnalyzeRequest(type=resource_type, properties=_struct(props), name=name,
                                              urn=f"urn:pulumi:dev::trainforge::{resource_type}::{name}")
        request.provider.CopyFrom(analyzer_pb2.AnalyzerProviderResource(type="pulumi:providers:aws", properties=_struct(provider),
                                                                       urn="urn:provider", name="aws"))
        for d in analyzer.Analyze(request).diagnostics:
            if d.enforcementLevel == analyzer_pb2.MANDATORY:
                found.append((d.policyName, d.message))
            else:
                advised.add(d.policyName)
    # The one warning a shipped stack gets: dev's database goes with `pulumi destroy` (prod's is protected).
    assert advised == ({"rds-deletion-protected"} if path.name == "Pulumi.dev.yaml" else set())
    stack = analyzer_pb2.AnalyzeStackRequest(resources=[
        analyzer_pb2.AnalyzerResource(type=r.resource_type, properties=_struct(r.props), urn=r.urn, name=r.name, dependencies=list(r.dependencies))
        for r in whole])
    diagnostics = analyzer.AnalyzeStack(stack).diagnostics
    found += [(d.policyName, d.message) for d in diagnostics if d.enforcementLevel == analyzer_pb2.MANDATORY]
    assert found == []


def test_the_readme_carries_the_generated_rule_table():
    assert rules_table() in (REPO / "README.md").read_text(), "README is stale: paste `python -m trainforge.policies.pack` into it"


@pytest.mark.parametrize("tamper,fix", [
    (lambda spec: spec.update(hostNetwork=True), "remove hostNetwork"),
    (lambda spec: spec.update(hostPID=True), "remove hostPID"),
    (lambda spec: spec["containers"][0].update(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}), "SYS_ADMIN"),
], ids=["hostNetwork", "hostPID", "SYS_ADMIN"])
def test_host_namespaces_and_added_capabilities_are_refused_outside_system_namespaces(tamper, fix):
    spec = {"containers": [{"name": "x", "image": "x"}]}
    tamper(spec)
    rule = BY_NAME["no-privileged-pods-outside-system-namespaces"]
    job = {"metadata": {"namespace": "team-vision"}, "spec": {"template": {"spec": spec}}}
    assert any(fix in m for m in check_resource(rule, "kubernetes:batch/v1:Job", job))
    job["metadata"]["namespace"] = "kube-system"
    assert check_resource(rule, "kubernetes:batch/v1:Job", job) == []


def _add(statement):
    return lambda statements: statements.append(statement)


@pytest.mark.parametrize("injected, says", [
    (dict(widen=_add({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})), "on '*'"),
    (dict(widen=_add({"Effect": "Allow", "Action": ["iam:PassRole"], "Resource": "arn:aws:iam::1:role/x"})), "'iam:PassRole'"),
    (dict(widen=_add({"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": ["arn:aws:s3:::dev-datasets/*"]})), "datasets are read-only"),
    (dict(widen=_add({"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": ["arn:aws:s3:::dev-checkpoints"]})), "s3:prefix"),
    (dict(widen=_add({"Effect": "Allow", "NotAction": ["iam:*"], "Resource": ["arn:aws:s3:::dev-artifacts/teams/vision/*"]})), "NotAction"),
    (dict(attach="arn:aws:iam::aws:policy/AdministratorAccess"), "AdministratorAccess"),
    (dict(trust="team-language"), "trust only system:serviceaccount:team-vision:"),
    (dict(widen=lambda statements: next(s for s in statements if s.get("Sid") == "UseDataKey").pop("Condition")), "kms:ViaService"),
])
def test_each_way_of_widening_a_team_role_is_caught(injected, says):
    found = check_stack(BY_NAME["team-roles-confined"], team_role_stack(**injected))
    assert any(says in message for message, _ in found), found


@pytest.mark.parametrize("volume, says", [
    (lambda: team_pv("a", claimed_by="a", read_only=True), None),  # the datasets, read-only: compliant
    (lambda: {**team_pv("a", claimed_by="b"), "metadata": {"name": "x", "labels": {}}}, "team 'a''s directory"),
    (lambda: team_pv("b", claimed_by="b") | {"metadata": {"name": "x", "labels": {"trainforge.io/team": "a"}}}, "claimRef.namespace team-a"),
    (lambda: _with_mount(team_pv("a", claimed_by="a"), "abcd"), "the file system's root"),
    (lambda: _with_mount(team_pv("a", claimed_by="a", read_only=True), "abcd"), "the file system's root"),
    (lambda: _with_mount(team_pv("a", claimed_by="a"), "abcd/datasets"), "readOnly: true"),
])
def test_each_way_of_giving_a_team_another_volume_is_caught(volume, says):
    found = check_resource(BY_NAME["team-volumes-reach-only-their-team"], "kubernetes:core/v1:PersistentVolume", volume())
    assert (found == []) if says is None else any(says in m for m in found), found


def _with_mount(pv, mount_name):
    pv["spec"]["csi"]["volumeAttributes"]["mountname"] = mount_name
    return pv
