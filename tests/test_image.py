"""The runtime image every pod runs: its Dockerfile parses, starts the node launcher where the rendered pods expect
it, runs as a non-root user, and takes its Python requirements from pyproject.toml alone."""

from __future__ import annotations

import json
import subprocess
import tomllib

from support.repo import REPO
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from trainforge import contract
from trainforge.k8s_schema import pod_templates
from trainforge.platform.training.runtime import cluster_training_runtimes
from trainforge.trainer.placement import decide
from trainforge.trainer.render import LAUNCHER, render
from trainforge.trainer.spec import load_spec

DOCKERFILE = DockerfileParser(path=str(REPO / "Dockerfile"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(name: str) -> list[str]:
    return [i["value"] for i in DOCKERFILE.structure if i["instruction"] == name]


def test_the_dockerfile_parses_into_one_stage_from_a_pytorch_base():
    assert DOCKERFILE.baseimage.startswith("pytorch/pytorch:")
    assert len(instructions("FROM")) == 1


def test_the_entry_point_is_the_launcher_the_pods_run():
    (entrypoint,) = instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == LAUNCHER


def test_the_working_directory_is_where_the_rendered_containers_start():
    (workdir,) = instructions("WORKDIR")
    assert workdir == contract.IMAGE_WORKDIR
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    runtimes = {r["metadata"]["name"]: r for r in cluster_training_runtimes(contract.DEFAULT_RUNTIME_IMAGE)}
    job = render(spec, decide(spec), "trainjob")
    for pod in pod_templates(job, runtimes[job["spec"]["runtimeRef"]["name"]]).values():
        assert pod["spec"]["containers"][0]["workingDir"] == workdir
    for pod in pod_templates(render(spec, decide(spec), "pytorchjob")).values():
        assert pod["spec"]["containers"][0]["workingDir"] == workdir


def test_the_image_runs_as_a_non_root_user():
    user = instructions("USER")[-1]
    assert user.split(":")[0] not in ("0", "root")


def test_python_requirements_come_from_pyproject_alone():
    installs = [r for r in instructions("RUN") if "pip install" in r]
    # The training runtime, and the MLflow server the platform runs on this image (its auth app is trainforge's).
    assert installs and all('".[runtime,tracking-server]"' in r for r in installs), installs
    assert {"runtime", "tracking-server"} <= set(PYPROJECT["project"]["optional-dependencies"])
    assert not list(REPO.glob("requirements*.txt")), "a second list of requirements"
    copied = {i.split()[0] for i in instructions("COPY")}
    for folder in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        assert folder.split("/")[0] in copied or folder in copied, f"{folder} is packaged but not copied into the image"


def test_the_image_holds_what_a_cluster_sweeps_controller_imports():
    """The controller runs on the runtime image (trainer/controllers/sweep.py): every sampler a sweep spec accepts, the
    study database's driver and the API client must be installed there, not only in the `sweep` extra."""
    import re
    names = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in
             PYPROJECT["project"]["optional-dependencies"]["runtime"] + PYPROJECT["project"]["dependencies"]}
    assert {"optuna", "cmaes", "psycopg2-binary", "kubernetes", "mlflow-skinny"} <= names, names


def test_the_base_images_torch_satisfies_the_runtime_range():
    torch = next(Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["runtime"] if r.startswith("torch"))
    default = next(a.split("=", 1)[1] for a in instructions("ARG") if a.startswith("TORCH_VERSION="))
    assert torch.specifier.contains(default), f"base torch {default} is outside {torch.specifier}"
    assert f"{default}-" in DOCKERFILE.baseimage or "${TORCH_VERSION}" in DOCKERFILE.structure[[i["instruction"] for i in DOCKERFILE.structure].index("FROM")]["value"]


def test_the_build_script_tags_by_content_as_the_program_does_and_a_release_once():
    """scripts/build-image: the content tag the program gives the same sources (so a hand push and an `up` agree, and
    unchanged sources are the same tag), the release tag only with --release, the sources' digest as the build arg the
    runs record."""
    from trainforge.infra.registry import context_digest
    repository = "444455556666.dkr.ecr.us-east-1.amazonaws.com/" + contract.runtime_image_repository("prod")
    version, digest = PYPROJECT["project"]["version"], context_digest(REPO)

    def dry_run(*extra: str) -> list[str]:
        return subprocess.run([str(REPO / "scripts" / "build-image"), "--repository", repository, "--dry-run", *extra],
                              capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    plain, release = dry_run(), dry_run("--release")
    assert [w for w in plain if w.startswith(repository)] == [f"{repository}:{contract.content_image_tag(version, digest)}"]
    assert f"{repository}:{contract.runtime_image_tag(version)}" in release
    assert f"SOURCE_DIGEST={digest}" in plain and "--push" in plain and "linux/amd64" in plain
    assert contract.runtime_image("444455556666", "us-east-1", "prod", version) == f"{repository}:v{version}"


def test_a_job_without_an_image_runs_its_stacks_release_image():
    from trainforge.stackconfig import load_stack_file
    from trainforge.trainer.spec import with_image
    platform = load_stack_file(REPO / "stacks" / "Pulumi.prod.yaml")
    spec = with_image(load_spec(REPO / "examples" / "llm-pretrain-efa.yaml"), platform)
    job = render(spec, decide(spec, platform), "trainjob")
    assert job["spec"]["trainer"]["image"] == contract.runtime_image(platform.account_id, "us-east-1", "prod", PYPROJECT["project"]["version"])
    assert with_image(spec.model_copy(update={"image": "my.registry/x:1"}), platform).image == "my.registry/x:1"
