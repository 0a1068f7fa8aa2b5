"""The `trainforge-torch` ClusterTrainingRuntimes: the restart rules and grace period every TrainJob inherits.

Two runtimes, one per grace class (contract.TRAINING_RUNTIME_GRACE_S): `trainforge-torch` for on-demand jobs and
`trainforge-torch-spot`, whose pods get the two minutes of an EC2 spot notice for the emergency checkpoint and its
upload. Kubeflow Trainer 2.2.1 reads `terminationGracePeriodSeconds` only from the runtime's pod template: a
TrainJob's runtime patch has no such field there, and the API server prunes it silently.

A TrainJob cannot carry Job failure policies (its runtime patches reach only the pod template), so the rules
that make spot training work live here, once, for every team. They read the node launcher's exit code
(trainer/launch.py, exits.EXIT_*):

- 143, preempted: the workers took an emergency checkpoint. The whole group is recreated and resumes; this
  does not count against `maxRestarts` (spot may reclaim a long job many times; `activeDeadlineSeconds`,
  the job's max runtime, bounds the cost).
- 1-127, a user error: the job fails at once. Retrying a bad config or a bug only burns GPU hours.
- anything else (137: a worker killed or OOM, node lost): the whole group is recreated from the last
  checkpoint, up to `maxRestarts` times.

Pure data (no pulumi import): the platform layer applies it; tests validate it against the CRD and the
Kubernetes schemas.
"""

from __future__ import annotations

from typing import Any

from trainforge import contract, exits

FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # marks the job the TrainJob's trainer section overrides
USER_ERROR_CODES = list(range(1, 128))  # Kubernetes allows at most 255 values, sorted, and no 0 with operator In

RULE_PREEMPTED = "preemptedResumes"
RULE_USER_ERROR = "userErrorFailsTheJob"


def pod_failure_policy() -> dict[str, Any]:
    """Job-level rules: both 143 and 1-127 fail the Job at once (so JobSet sees why); the order is the contract
    of `preempted_message_pattern`: the Job controller names the matching rule's index in its failure message."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": contract.TRAINJOB_CONTAINER, "operator": "In",
                                              "values": [exits.EXIT_PREEMPTED]}},
        {"action": "FailJob", "onExitCodes": {"containerName": contract.TRAINJOB_CONTAINER, "operator": "In",
                                              "values": USER_ERROR_CODES}},
    ]}


def preempted_message_pattern() -> str:
    # The Job controller's message: "Container node for pod ns/name failed with exit code 143 matching FailJob
    # rule at index 0" (kubernetes pkg/controller/job/pod_failure_policy.go).
    return f"failed with exit code {exits.EXIT_PREEMPTED} matching FailJob rule at index 0"


def failure_policy(max_restarts: int) -> dict[str, Any]:
    """JobSet-level rules, first match wins; no match (137, node lost) restarts the set and counts."""
    return {
        "maxRestarts": max_restarts,
        "restartStrategy": "Recreate",  # a torch group cannot lose a member: every node restarts from the checkpoint
        "rules": [
            {"name": RULE_PREEMPTED, "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"],
             "onJobFailureMessagePatterns": [preempted_message_pattern()]},
            {"name": RULE_USER_ERROR, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
        ],
    }


def cluster_training_runtimes(default_image: Any, max_restarts: int = 10) -> list[dict[str, Any]]:
    """One runtime per grace class, the same in everything else."""
    return [cluster_training_runtime(default_image, max_restarts, name=name) for name in contract.TRAINING_RUNTIME_GRACE_S]


def cluster_training_runtime(default_image: str, max_restarts: int = 10, *, name: str = contract.CLUSTER_TRAINING_RUNTIME) -> dict[str, Any]:
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    if name not in contract.TRAINING_RUNTIME_GRACE_S:
        raise ValueError(f"no grace class for runtime {name!r}; known: {sorted(contract.TRAINING_RUNTIME_GRACE_S)}")
    return {
        "apiVersion": contract.TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name,
                     "labels": {FRAMEWORK_LABEL: "torch", contract.LABEL_MANAGED_BY: contract.MANAGED_BY_LABEL_VALUE}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {
                "failurePolicy": failure_policy(max_restarts),
                "replicatedJobs": [{
                    "name": contract.TRAINJOB_REPLICATED_JOB,
                    "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                        "spec": {
                            "backoffLimit": 0,  # any pod failure is a Job failure: the JobSet rules decide what follows
                            "podFailurePolicy": pod_failure_policy(),
                            "template": {"spec": {
                                "restartPolicy": "Never",  # required by podFailurePolicy
                                # Nothing in a training pod talks to the Kubernetes API; IRSA's token is its own volume.
                                "automountServiceAccountToken": False,
                                "terminationGracePeriodSeconds": contract.TRAINING_RUNTIME_GRACE_S[name],
                                # The image's working directory (a TrainJob's runtime patch cannot set one in 2.2.1).
                                "containers": [{"name": contract.TRAINJOB_CONTAINER, "image": default_image,
                                                "workingDir": contract.IMAGE_WORKDIR,
                                                "securityContext": dict(contract.TRAINING_CONTAINER_SECURITY),
                                                # Local rank 0's metrics endpoint, scraped by the trainer PodMonitor.
                                                "ports": [{"name": contract.METRICS_PORT_NAME, "containerPort": contract.METRICS_PORT}]}],
                            }},
                        },
                    },
                }],
            }},
        },
    }
