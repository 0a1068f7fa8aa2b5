"""A team stack's program (`<env>.team-<team>`): one team's resources on a platform another stack deployed.

It reads the platform stack's outputs through a StackReference (the cluster, its OIDC provider, the buckets and data key,
FSx, the runtime image, the database) and builds exactly what the platform stack builds for a team it declares itself:
the same components, names and inputs (infra/teams.py's TeamAccess, the team's two FSx volumes and its directory Job,
platform/components/tenancy.py's Tenancy). So a team moved out of the platform stack with `pulumi state move` is adopted,
not recreated (README, "Teams in their own stacks"); a test checks each moved URN against this program's.

What the move cannot carry is a parent that stays behind: the volumes, the directory Job and the Kubernetes provider lived
under platform components (SharedStorage, TeamDirectories, Cluster). `pulumi state move` hangs such a resource under the
destination's root stack (pulumi/pulumi pkg/cmd/pulumi/state/state_move.go) and, since CLI 3.224.0 (pulumi/pulumi#21953),
rebuilds the URN from the new parent, dropping the old parent's type: that is the URN of a top-level resource, so here
they are top-level resources. The move needs CLI >= 3.226.0 (PULUMI_CLI_FOR_MOVES): before it, moving resources whose
provider depends on resources that stay behind aborts ("destination snapshot integrity ... refers to missing
resource", pulumi/pulumi#22141), which every team's move does, so no older CLI can move a team at all. A test checks
each moved URN against the platform program's real URNs.
"""

from __future__ import annotations

from typing import Any

import pulumi

from trainforge import contract
from trainforge.infra.cluster import kubernetes_provider
from trainforge.infra.layer import aws_provider, team_access_name
from trainforge.infra.storage import BUCKET_KINDS
from trainforge.infra.teams import TeamAccess
from trainforge.infra.tags import cost_tags
from trainforge.platform.components import kubernetes as platform_k8s
from trainforge.platform.components.objects import apply, resource_name, type_token
from trainforge.platform.components.tenancy import SweepDatabase, Tenancy, TrackingUser
from trainforge.platform.manifests import storage
from trainforge.stackconfig import PlatformConfig, TeamConfig


def platform_stack_reference(environment: str) -> str:
    """The platform stack's fully qualified name: same organisation and project, stack `<env>`."""
    return f"{pulumi.get_organization()}/{pulumi.get_project()}/{environment}"


# The first Pulumi CLI whose `pulumi state move` can move a team (pulumi/pulumi#22141, released in 3.226.0).
PULUMI_CLI_FOR_MOVES = "3.226.0"


def refuse_other_settings(deployed: str, expected: str, environment: str) -> str:
    if deployed != expected:
        raise pulumi.RunError(
            f"the platform stack {environment!r} was deployed from other settings than stacks/Pulumi.{environment}.yaml in this "
            f"checkout (settings digest {deployed}, here {expected}): the team's objects would not match its cluster. "
            f"Fix: `pulumi up -s {environment}` first (or update this checkout to the revision the platform runs)")
    return deployed


def build_team_stack(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """Register one team's resources on the deployed platform `cfg` describes; return the team stack's outputs."""
    from trainforge.pricing import price_table

    env = cfg.environment
    platform = pulumi.StackReference(f"{env}-platform", stack_name=platform_stack_reference(env))
    digest = platform.get_output("config_digest").apply(lambda d: refuse_other_settings(d, cfg.settings_digest(), env))

    def out(name: str) -> pulumi.Output:
        """A platform output, only once the platform is known to run this checkout's settings: every resource takes its
        platform inputs from here (the Kubernetes objects through the provider's kubeconfig), so on other settings the
        update fails before anything is created."""
        return pulumi.Output.all(digest, platform.get_output(name)).apply(lambda values: values[1])

    aws_opts = pulumi.ResourceOptions(providers={"aws": aws_provider(cfg)})
    k8s = kubernetes_provider(cfg.cluster_name, out("kubeconfig"), pulumi.ResourceOptions())
    arns = out("bucket_arns")
    bucket_arns: dict[str, pulumi.Input[str]] = {kind: arns[kind] for kind in BUCKET_KINDS}
    access = TeamAccess(team_access_name(cfg, team), team, cluster_name=out("cluster_name"), oidc_provider_arn=out("oidc_provider_arn"),
                        oidc_issuer_url=out("oidc_issuer_url"), bucket_arns=bucket_arns,
                        data_key_arn=out("data_key_arn"), tags=cost_tags(cfg.tags, env), opts=aws_opts)

    fsx = out("fsx")
    volumes = [apply(v, parent=None, provider=k8s)
               for v in storage.team_volumes(team.name, file_system_id=fsx["id"], dns_name=fsx["dns_name"], mount_name=fsx["mount_name"],
                                             capacity_gib=cfg.fsx.storage_capacity_gib, datasets_path=cfg.fsx.datasets_path)]
    image = out("runtime_image")
    directory = apply(platform_k8s.team_directory_job(cfg, team), parent=None, provider=k8s)
    # Its quota on the root the platform stack mounts in kube-system (the platform's TeamDirectories).
    quota = platform_k8s.team_quota_job(cfg, team)
    quota_job = [apply(quota, parent=None, provider=k8s)] if quota is not None else []
    # The platform's own objects (Kueue, the StorageClass, guardrails, the MLflow server) are deployed: nothing to wait for
    # but this team's volumes, directory and quota.
    tenancy = Tenancy(platform_k8s.tenancy_name(cfg, team), cfg, team, role_arn=access.role.arn, prices_as_of=price_table().as_of,
                      after=[*volumes, directory, *quota_job],
                      database=SweepDatabase(out("mlflow_database"), platform_k8s.DATABASE_SECRET, after=[]),
                      tracking=TrackingUser(image, after=[]), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
    return {
        "environment": env,
        "team": team.name,
        "namespace": tenancy.namespace,
        "role_arn": access.role.arn,
        "gpu_quota": {f.value: n for f, n in team.gpu_quota.items()},
        contract.SETTING_BUDGET_USD: team.monthly_budget_usd,
        "platform_config_digest": digest,  # exported, so a platform deployed from other settings fails the update
    }


def state_move_urns(cfg: PlatformConfig, team: TeamConfig, project: str = contract.PROJECT) -> list[str]:
    """What `pulumi state move --source <env> --dest <env>.team-<team>` is given to move a team the platform stack declares
    into its own stack: the team's two components (their children follow), its volumes and its directory Job. The
    providers are copied by the command itself."""
    def urn(type_chain: str, name: str) -> str:
        return f"urn:pulumi:{cfg.environment}::{project}::{type_chain}::{name}"
    volumes = storage.team_volumes(team.name, file_system_id="", dns_name="", mount_name="",  # names only: ids name nothing
                                   capacity_gib=cfg.fsx.storage_capacity_gib, datasets_path=cfg.fsx.datasets_path)
    jobs = [job for job in (platform_k8s.team_directory_job(cfg, team), platform_k8s.team_quota_job(cfg, team)) if job is not None]
    return [urn(TeamAccess.TYPE, team_access_name(cfg, team)),
            urn(Tenancy.TYPE, platform_k8s.tenancy_name(cfg, team)),
            *(urn(f"{platform_k8s.SharedStorage.TYPE}${type_token(v)}", resource_name(v)) for v in volumes),
            *(urn(f"{platform_k8s.TeamDirectories.TYPE}${type_token(job)}", resource_name(job)) for job in jobs)]


def move_commands(cfg: PlatformConfig, team: TeamConfig) -> list[str]:
    """The commands that move an already-deployed team out of the platform stack without recreating anything."""
    stack = f"{cfg.environment}.team-{team.name}"
    urns = " \\\n    ".join(f"'{u}'" for u in state_move_urns(cfg, team))
    need = PULUMI_CLI_FOR_MOVES
    return [f'[ "$(printf "%s\\n" {need} "$(pulumi version | tr -d v)" | sort -V | head -n1)" = {need} ] '
            f'|| {{ echo "pulumi state move of a team needs Pulumi CLI >= {need} (pulumi/pulumi#22141)" >&2; exit 1; }}',
            f"pulumi stack init {stack} --secrets-provider <the platform stack's>   # it reads the platform's secret outputs",
            f"pulumi state move --source {cfg.environment} --dest {stack} \\\n    {urns}",
            f"pulumi preview -s {stack}   # expect: 0 to create, 0 to replace, 0 to delete",
            f"pulumi preview -s {cfg.environment}   # expect: no change to any resource (the team's outputs go)"]
