"""One source of truth for the cluster software's versions: the CRD schemas every rendered object is validated
against are the versions the platform pins (trainforge.versions), and the pinned Kueue manages the pinned Trainer."""

from __future__ import annotations

import hashlib
from importlib import resources

import yaml

from trainforge import k8s_schema, versions

CRDS = resources.files("trainforge") / "schemas" / "crds"
MANIFEST = yaml.safe_load((CRDS / "VERSIONS.yaml").read_text())


def test_every_schema_file_is_listed_with_its_checksum():
    """Replacing a schema file (say, with Trainer 2.3's) without updating the list fails here."""
    files = {f.name for f in CRDS.iterdir() if f.name.endswith(".yaml") and f.name != "VERSIONS.yaml"}
    assert files == set(MANIFEST)
    for name, entry in MANIFEST.items():
        assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == entry["sha256"], f"{name} changed without VERSIONS.yaml"


def test_the_schemas_are_the_versions_the_platform_pins():
    """Bumping a pinned version without the schema files (or the reverse) fails here."""
    for name, entry in MANIFEST.items():
        assert entry["version"] == versions.COMPONENTS[entry["component"]], f"{name} is {entry['component']} {entry['version']}"


def test_every_kind_the_validator_knows_has_a_listed_schema():
    for file_name, _ in k8s_schema.KINDS.values():
        assert file_name in MANIFEST


def test_the_pinned_kueue_manages_the_pinned_trainer():
    assert versions.kueue_manages(versions.KUEUE, versions.KUBEFLOW_TRAINER)
    assert not versions.kueue_manages(versions.KUEUE, "2.3.0"), "no released Kueue manages Trainer 2.3"


def test_a_trainjob_with_a_grace_period_in_its_patch_is_rejected_by_the_pinned_crd():
    """The field Trainer 2.3 added and 2.2.1 prunes: the strict check must say so, not let it vanish on the cluster."""
    from support.repo import REPO

    from trainforge.trainer.placement import decide
    from trainforge.trainer.render import render
    from trainforge.trainer.spec import load_spec
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    job = render(spec, decide(spec), "trainjob")
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 120
    assert any("terminationGracePeriodSeconds" in p for p in k8s_schema.problems(job))


def test_the_tests_run_the_mlflow_server_the_pinned_chart_runs():
    """The auth app's API and permission model change between MLflow releases (3.x added roles and workspaces): the
    server the tests start must be the chart's appVersion."""
    import re
    import tomllib
    from pathlib import Path

    from support import helm
    from trainforge.platform.manifests import charts
    version = charts.CHARTS["mlflow"].version
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    (pin,) = [r for r in project["project"]["optional-dependencies"]["tracking-server"] if r.startswith("mlflow[auth]")]
    app_version = yaml.safe_load((helm.chart_dir("mlflow", version) / "Chart.yaml").read_text())["appVersion"]
    assert re.fullmatch(r"mlflow\[auth\]==([0-9.]+)", pin).group(1) == app_version
