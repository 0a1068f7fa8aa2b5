"""Every example spec, every kind, every capacity: the rendered job validates against the CRD schemas and
carries what the cluster needs to place, feed, restart and bill it."""

from __future__ import annotations

import json

import copy
from pathlib import Path

import pytest
from support.repo import KUBERNETES_VERSIONS, REPO, SPECS

from trainforge import catalog, contract
from trainforge.k8s_schema import core_problems, pod_templates, problems
from trainforge.trainer.placement import decide
from trainforge.trainer.render import render as render_placed
from trainforge.trainer.spec import load_spec


def render(spec, kind="trainjob", cost_centre=None, platform=None):
    """The manifest as submitted: placed once (against the stack when given), then rendered."""
    return render_placed(spec, decide(spec, platform), kind, cost_centre)

KINDS = ["trainjob", "pytorchjob"]
STACKS = sorted((Path(__file__).resolve().parents[1] / "stacks").glob("Pulumi.*.yaml"))
CAPACITIES = ["on-demand", "spot", "spot-fallback"]


def pod_of(manifest):
    if manifest["kind"] == "TrainJob":
        job = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = job["template"]["spec"]["template"]["spec"]
        return pod, manifest["spec"]["trainer"]["resourcesPerNode"]["limits"], manifest["spec"]["trainer"]
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return pod, pod["containers"][0]["resources"]["limits"], pod["containers"][0]


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_rendered_jobs_validate_and_carry_placement_resources_and_labels(path, kind, capacity):
    spec = load_spec(path).model_copy(update={"capacity": capacity})
    manifest = render(spec, kind, cost_centre="cc-1001-vision")
    assert problems(manifest) == []
    for version in KUBERNETES_VERSIONS:
        assert core_problems(manifest, version) == []
    pod, limits, trainer = pod_of(manifest)
    labels = manifest["metadata"]["labels"]
    assert labels[contract.KUEUE_QUEUE_LABEL] == contract.queue_name(spec.team)
    assert labels[contract.KUEUE_PRIORITY_LABEL] == contract.priority_class_name(spec.priority)
    assert labels["trainforge.io/cost-centre"] == "cc-1001-vision" and labels["trainforge.io/team"] == spec.team
    assert manifest["metadata"]["namespace"] == contract.namespace_name(spec.team)
    assert limits[contract.RESOURCE_GPU] == spec.resources.gpus()
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == contract.FSX_CLAIM_NAME
    assert pod["serviceAccountName"] == contract.TRAINING_SERVICE_ACCOUNT
    tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"]}
    assert (contract.TAINT_GPU, "NoSchedule") in tolerated
    assert ((contract.TAINT_SPOT, "NoSchedule") in tolerated) == (capacity != "on-demand")
    if kind == "trainjob":
        # Trainer 2.2.1 takes the grace period from the runtime only (a patch's would be pruned): the TrainJob names it.
        assert "terminationGracePeriodSeconds" not in pod
        assert manifest["spec"]["runtimeRef"]["name"] == (contract.CLUSTER_TRAINING_RUNTIME_SPOT if capacity != "on-demand"
                                                           else contract.CLUSTER_TRAINING_RUNTIME)
    elif capacity != "on-demand":
        assert pod["terminationGracePeriodSeconds"] >= 120
    if capacity == "spot":
        assert pod["nodeSelector"][contract.LABEL_FLAVOUR] == "gpu-spot"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer["env"]}
    assert env["MLFLOW_TRACKING_URI"] == contract.MLFLOW_TRACKING_URI and env["TRAINFORGE_JOB_ID"] == spec.name
    # The team's MLflow user signs the pod in; its password is never in the manifest.
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"secretKeyRef": {"name": contract.MLFLOW_SECRET, "key": contract.MLFLOW_PASSWORD_KEY}}
    if spec.checkpoint.s3_uri:
        assert env["TRAINFORGE_CHECKPOINT_S3_URI"] == spec.checkpoint.s3_uri
    if kind == "pytorchjob":
        for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
            assert replica["restartPolicy"] == "ExitCode", "preempted (143) must restart, user errors (1-127) must not"
        assert sum(r["replicas"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()) == spec.workers.nodes


def test_efa_jobs_request_every_efa_device_of_the_instance_type():
    spec = load_spec(next(p for p in SPECS if "efa" in p.name))
    for kind in KINDS:
        _, limits, _ = pod_of(render(spec, kind))
        assert limits[contract.RESOURCE_EFA] == catalog.efa_device_count(catalog.lookup("p5.48xlarge")) == 32
        assert limits[contract.RESOURCE_GPU] == 8


def env_of(manifest) -> dict[str, str]:
    if manifest["kind"] == "TrainJob":
        container = manifest["spec"]["trainer"]
    else:
        container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return {v["name"]: v.get("value") for v in container["env"]}


@pytest.mark.parametrize("instance_type,expected", [
    ("p5.48xlarge", {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}),  # EFA with GPUDirect RDMA
    ("g5.48xlarge", {"FI_PROVIDER": "efa"}),  # EFA without RDMA: libfabric must not be told to use it (issue 38, item 6)
])
def test_libfabric_is_set_only_where_the_pod_gets_efa_and_rdma_only_where_the_type_has_it(instance_type, expected):
    spec = load_spec(next(p for p in SPECS if "efa" in p.name))
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"instance_type": instance_type})})
    for kind in KINDS:
        manifest = render(spec, kind)
        assert pod_of(manifest)[1].get(contract.RESOURCE_EFA), "an EFA job"
        env = env_of(manifest)
        assert {k: env[k] for k in env if k.startswith("FI_")} == expected
    single = render(spec.model_copy(update={"capacity": "spot"}), "trainjob")
    assert not [k for k in env_of(single) if k.startswith("FI_")], "no EFA devices, no libfabric settings"


def test_a_pod_is_told_the_gpus_it_was_given_and_the_node_it_runs_on():
    """The runtime stops when CUDA sees fewer GPUs than the pod was given (it would train on the CPU), naming the node."""
    for path in SPECS:
        for kind in KINDS:
            manifest = render(load_spec(path), kind)
            _, limits, container = pod_of(manifest)
            env = {v["name"]: v for v in container["env"]}
            given = env.get(contract.GPUS_PER_NODE_ENV, {}).get("value")
            assert given == (str(limits[contract.RESOURCE_GPU]) if limits.get(contract.RESOURCE_GPU) else None), (path.name, kind)
            assert env[contract.NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert any(contract.GPUS_PER_NODE_ENV in env_of(render(load_spec(path))) for path in SPECS), "some example asks for GPUs"


def test_single_node_and_spot_jobs_request_no_efa():
    for path in SPECS:
        spec = load_spec(path).model_copy(update={"capacity": "spot"})
        _, limits, _ = pod_of(render(spec, "trainjob"))
        assert contract.RESOURCE_EFA not in limits


def test_the_strict_schema_catches_a_misspelt_field():
    manifest = render(load_spec(SPECS[0]), "trainjob")
    broken = copy.deepcopy(manifest)
    broken["spec"]["trainer"]["numProcsPerNode"] = broken["spec"]["trainer"].pop("numProcPerNode")
    assert any("numProcsPerNode" in p for p in problems(broken))
    broken = copy.deepcopy(manifest)
    pod, _, _ = pod_of(broken)
    pod["tolerations"][0]["efect"] = pod["tolerations"][0].pop("effect")
    assert any("efect" in p for p in problems(broken))


def test_the_core_schemas_check_the_merged_pod_for_the_clusters_kubernetes_version():
    # The controller merges the TrainJob's trainer section into the patched pod: a bad env entry is a bad pod.
    manifest = render(load_spec(SPECS[0]), "trainjob")
    broken = copy.deepcopy(manifest)
    broken["spec"]["trainer"]["env"].append({"name": "NCCL_DEBUG", "valeu": "INFO"})
    assert [p for p in core_problems(broken, KUBERNETES_VERSIONS[0]) if p.startswith("node:") and "valeu" in p]
    # PodSpec.hostnameOverride exists from Kubernetes 1.34: a pod carrying it is valid there and not on 1.33.
    newer = copy.deepcopy(manifest)
    pod_of(newer)[0]["hostnameOverride"] = "worker-0"
    assert core_problems(newer, "1.35") == []
    assert any("hostnameOverride" in p for p in core_problems(newer, "1.33"))


def test_every_replica_of_a_pytorchjob_is_a_valid_core_pod():
    spec = load_spec(next(p for p in SPECS if "efa" in p.name))
    manifest = render(spec, "pytorchjob")
    assert set(pod_templates(manifest)) == {"Master", "Worker"}
    broken = copy.deepcopy(manifest)
    broken["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9400"
    assert any(p.startswith("Worker:") for p in core_problems(broken, KUBERNETES_VERSIONS[0]))


def test_runtime_arguments_carry_identity_paths_and_hyperparameters():
    spec = load_spec(next(p for p in SPECS if p.name == "quickstart.yaml"))
    _, _, trainer = pod_of(render(spec, "trainjob"))
    sets = dict(a.split("=", 1) for a in trainer["args"][1::2])
    assert sets["job_id"] == "quickstart" and sets["team"] == "vision" and sets["task"] == "char_lm"
    assert sets["checkpoint.dir"] == "/fsx/teams/vision/jobs/quickstart/checkpoints"
    assert sets["max_steps"] == "120" and sets["precision"] == "auto"
    assert int(sets["checkpoint.preemption_grace_s"]) < contract.SPOT_TERMINATION_GRACE_S


@pytest.mark.parametrize("kind", KINDS)
def test_pods_run_the_launcher_so_the_exit_code_reaches_the_restart_rules(kind):
    # torchrun alone exits 1 for a spot notice too, which ExitCode / podFailurePolicy would read as a user error.
    for path in SPECS:
        spec = load_spec(path)
        _, _, trainer = pod_of(render(spec, kind))
        assert trainer["command"][:3] == ["python", "-m", "trainforge.trainer.launch"]
        if spec.entry.command:
            assert trainer["command"][-len(spec.entry.command) - 2:] == ["--rank", "--", *spec.entry.command]
            variables = {e["name"]: e.get("value") for e in trainer["env"]}
            assert json.loads(variables[contract.HYPERPARAMETERS_ENV]) == spec.hyperparameters  # a command reads no RunConfig


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("kind", KINDS)
def test_torchrun_waits_for_the_emergency_checkpoint_until_just_before_the_kubelets_sigkill(kind, capacity):
    """torchrun SIGKILLs its workers 30 s after passing a SIGTERM on, unless told otherwise: the pod tells it the pods'
    own grace period (the runtime's or the pod template's) less a margin, and the workers' window ends before that."""
    from trainforge.platform.training.runtime import cluster_training_runtimes
    grace_of_runtime = {r["metadata"]["name"]: r["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
                        ["spec"]["terminationGracePeriodSeconds"] for r in cluster_training_runtimes("image:1")}
    for path in SPECS:
        spec = load_spec(path).model_copy(update={"capacity": capacity})
        manifest = render(spec, kind)
        pod, _, trainer = pod_of(manifest)
        grace = grace_of_runtime[manifest["spec"]["runtimeRef"]["name"]] if kind == "trainjob" else pod["terminationGracePeriodSeconds"]
        waits = int(env_of(manifest)[contract.TORCHRUN_SHUTDOWN_TIMEOUT_ENV])
        assert 30 < waits == contract.torchrun_shutdown_timeout_s(grace) < grace, (path.name, kind, capacity)
        if not spec.entry.command:
            window = int(dict(a.split("=", 1) for a in trainer["args"][1::2])["checkpoint.preemption_grace_s"])
            assert window < waits, "the runtime's own deadline comes first"


def test_render_without_a_stack_says_what_it_assumed_and_keeps_the_manifest_clean():
    import subprocess
    import sys

    import yaml
    cli = [sys.executable, "-m", "trainforge.trainer.cli", "render"]
    efa = subprocess.run([*cli, "examples/llm-pretrain-efa.yaml"], capture_output=True, text=True, cwd=REPO)
    assert efa.returncode == 0, efa.stderr
    assert yaml.safe_load(efa.stdout)["kind"] == "TrainJob"  # stdout is the manifest alone
    assert "rendered without --stack" in efa.stderr and "EFA node group for p5.48xlarge" in efa.stderr
    assert "from the instance catalogue" in efa.stderr and "--stack stacks/Pulumi.<env>.yaml" in efa.stderr
    with_stack = subprocess.run([*cli, "examples/llm-pretrain-efa.yaml", "--stack", "stacks/Pulumi.prod.yaml"],
                                capture_output=True, text=True, cwd=REPO)
    assert with_stack.returncode == 0 and "assumed" not in with_stack.stderr
