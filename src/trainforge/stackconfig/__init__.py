"""The typed stack config (`trainforge:platform` in `stacks/Pulumi.<env>.yaml`) and its one loader.

    aws.py       network, cluster, FSx, buckets, tags: one slice per AWS component
    node_groups.py  the node groups: instance types, capacity, sizes, EFA, reservations
    kubernetes.py  chart versions, Kueue, autoscaler, monitoring, MLflow: the platform layer's settings
    teams.py     a team: cost centre, GPU quota per flavour, budget, members
    platform.py  PlatformConfig, the whole stack, with the rules that span slices
    loader.py    read a stack file or the Pulumi config map; ConfigError names the field and the fix
    team_stacks.py  a team in its own stack (Pulumi.<env>.team-<team>.yaml); the cohort of a platform's teams, checked whole
"""

from trainforge.stackconfig.aws import BucketsConfig, ClusterConfig, DataRepositoryConfig, FsxConfig, NetworkConfig, TagsConfig
from trainforge.stackconfig.node_groups import NodeGroupConfig
from trainforge.stackconfig.kubernetes import KubernetesConfig, MlflowConfig, MonitoringConfig
from trainforge.stackconfig.loader import (CONFIG_KEY, STACK_FILE_PATTERN, TEAM_CONFIG_KEY, ConfigError, StackFile, from_config_map, parse,
                                           read_stack_file, stack_file_name, stack_files)
from trainforge.stackconfig.platform import PlatformConfig
from trainforge.stackconfig.teams import TeamConfig
from trainforge.stackconfig.team_stacks import (Cohort, TeamStack, cohort, is_team_stack_file, load_cohort,
                                                load_stack_file, read_team_stack_file, split_stack_name, team_from_config_map,
                                                team_stack_name)

__all__ = ["BucketsConfig", "CONFIG_KEY", "ClusterConfig", "ConfigError", "DataRepositoryConfig", "FsxConfig", "KubernetesConfig", "MlflowConfig", "MonitoringConfig", "NetworkConfig",
           "NodeGroupConfig", "PlatformConfig", "STACK_FILE_PATTERN", "StackFile", "TagsConfig", "TeamConfig", "from_config_map",
           "load_stack_file", "parse", "read_stack_file", "stack_file_name", "stack_files", "TEAM_CONFIG_KEY", "Cohort", "TeamStack", "cohort",
           "is_team_stack_file", "load_cohort", "read_team_stack_file", "split_stack_name", "team_from_config_map", "team_stack_name"]
