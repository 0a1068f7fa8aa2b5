"""The program's Helm releases rendered through the real chart templates at the pinned versions, offline.

`helm-python-sdk` carries Helm's Go SDK as a C library: `Chart.load(dir).render(values, name=, namespace=)` is
`helm template` (values validated against a chart's values.schema.json, subchart conditions applied, `lookup` empty).
The chart sources are vendored in tests/data/charts/ (one tarball per chart and enabled subchart, README there).
The values come from the evaluated program (what the engine recorded for each `helm.v3.Release`), never from a
copy written in a test.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

from support import run_cache
from trainforge.platform.manifests.crds import defined_kind

CHARTS = Path(__file__).resolve().parents[1] / "data" / "charts"


@functools.cache
def _unpacked() -> Path:
    """The vendored charts unpacked, each with its vendored subcharts under charts/ (as `helm dependency build` leaves
    it): once per test run for all its processes (support/run_cache.py), else once per process."""
    shared = run_cache.shared_directory("charts", _unpack)
    if shared is not None:
        return shared
    root = Path(tempfile.mkdtemp(prefix="trainforge-charts-"))
    atexit.register(shutil.rmtree, root, True)  # 17 MB per test process: left behind, a day of runs fills a disk
    _unpack(root)
    return root


def _unpack(root: Path) -> None:
    for archive in CHARTS.glob("*.tar.gz"):
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    for directory in [d for d in root.iterdir() if (d / "Chart.yaml").is_file()]:
        meta = yaml.load((directory / "Chart.yaml").read_text(), Loader=_Loader)
        for dependency in meta.get("dependencies") or []:
            target = directory / "charts" / dependency["name"]
            source = root / f"{dependency['name']}-{dependency['version']}"
            if not target.exists() and source.is_dir():
                shutil.copytree(source, target)  # a copy, not a link: Helm logs every link it follows


def chart_dir(name: str, version: str) -> Path:
    """The chart's directory with its vendored subcharts under charts/."""
    directory = _unpacked() / f"{name}-{version.lstrip('v')}"
    if not directory.is_dir():
        raise FileNotFoundError(f"no vendored source for chart {name} {version}: add it with scripts/vendor-chart "
                                f"(tests/data/charts/README.md)")
    return directory


@functools.cache
def _render(name: str, version: str, release: str, namespace: str, values_json: str) -> tuple[dict[str, Any], ...]:
    """Once per test run (support/run_cache.py), then once per process."""
    return run_cache.once("render", run_cache.digest(name, version, release, namespace, values_json),
                          lambda: _render_now(name, version, release, namespace, values_json))


def _render_now(name: str, version: str, release: str, namespace: str, values_json: str) -> tuple[dict[str, Any], ...]:
    import helm_python

    chart = helm_python.Chart.load(chart_dir(name, version))
    out = chart.render(json.loads(values_json), name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(out.items()):
        if not path.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        for doc in yaml.load_all(text, Loader=_Loader):  # libyaml's: a chart renders megabytes, ~10x the pure-Python parser
            if doc:
                doc.setdefault("metadata", {})
                if _namespaced(doc) and "namespace" not in doc["metadata"]:
                    doc["metadata"]["namespace"] = namespace  # `helm install -n` puts it there
                doc["metadata"].setdefault("annotations", {})
                objects.append(doc)
    return tuple(objects)


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "StorageClass", "PriorityClass",
                  "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService", "PersistentVolume",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterQueue", "ResourceFlavor", "Cohort",
                  "WorkloadPriorityClass", "ClusterTrainingRuntime"}


def _namespaced(obj: dict[str, Any]) -> bool:
    return obj.get("kind") not in CLUSTER_SCOPED


def chart_name(release_inputs: dict[str, Any]) -> str:
    """`chart` is a bare name for a repository chart, `oci://.../<name>` for an OCI one."""
    return release_inputs["chart"].rsplit("/", 1)[-1]


def render(release_inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object `helm install` would create for a release the program registered (its plain inputs)."""
    return [json.loads(json.dumps(o)) for o in _render(chart_name(release_inputs), release_inputs["version"], release_inputs["name"],
                                                     release_inputs["namespace"], json.dumps(release_inputs.get("values") or {},
                                                                                             sort_keys=True))]


def is_hook(obj: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML 1.1 as Go's parser reads it: a bare `=` (the prometheus-operator CRDs' enum) is a string, not a value tag."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _enabled(condition: str | None, values: dict[str, Any]) -> bool:
    """A subchart's `condition` (dotted paths, comma-separated: the first one that resolves decides)."""
    for path in (condition or "").split(","):
        node: Any = values
        for key in path.strip().split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, bool):
            return node
    return True


def crd_kinds(release_inputs: dict[str, Any]) -> set[str]:
    """`group/Kind` of every CRD the release installs: its chart's and enabled subcharts' `crds/` directories (Helm
    installs those first, unless the release skips them) and any CRD among its templates."""
    in_crds_dirs, in_templates = crd_sources(release_inputs)
    return set(in_templates) | (set() if release_inputs.get("skipCrds") else set(in_crds_dirs))


def crd_sources(release_inputs: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """(kinds defined in the chart's and its enabled subcharts' `crds/`, kinds defined by CRDs among its templates),
    whatever the release skips. Read once per chart and values per test process (parsing the CRDs' YAML takes seconds)."""
    return _crd_sources(json.dumps({k: v for k, v in release_inputs.items() if k != "skipCrds"}, sort_keys=True))


@functools.cache
def _crd_sources(release_json: str) -> tuple[frozenset[str], frozenset[str]]:
    return run_cache.once("crds", run_cache.digest(release_json), lambda: _crd_sources_now(release_json))


def _crd_sources_now(release_json: str) -> tuple[frozenset[str], frozenset[str]]:
    import helm_python

    release_inputs = json.loads(release_json)
    directory = chart_dir(chart_name(release_inputs), release_inputs["version"])
    chart = helm_python.Chart.load(directory)
    values = merged(chart.values, release_inputs.get("values") or {})
    conditions = {d["name"]: d.get("condition") for d in yaml.load((directory / "Chart.yaml").read_text(), Loader=_Loader).get("dependencies") or []}
    documents = []
    for crd in chart.crds:
        parts = crd["filename"].split("/")
        subchart = parts[2] if len(parts) > 3 and parts[1] == "charts" else None
        if subchart is None or _enabled(conditions.get(subchart), values):
            documents += [d for d in yaml.load_all(crd["data"], Loader=_Loader) if d]
    templates = [o for o in render(release_inputs) if o["kind"] == "CustomResourceDefinition"]
    return frozenset(map(defined_kind, documents)), frozenset(map(defined_kind, templates))


def chart_crd_documents(name: str, version: str) -> list[dict[str, Any]]:
    """Every CRD in a chart's and its subcharts' `crds/` directories, as parsed documents."""
    import helm_python
    return [d for crd in helm_python.Chart.load(chart_dir(name, version)).crds for d in yaml.load_all(crd["data"], Loader=_Loader) if d]


def merged(defaults: Any, ours: Any) -> Any:
    """Values as Helm computes them: ours over the chart's defaults, maps merged key by key."""
    if isinstance(defaults, dict) and isinstance(ours, dict):
        return {**defaults, **{k: merged(defaults.get(k), v) for k, v in ours.items()}}
    return ours


RELEASE = "kubernetes:helm.sh/v3:Release"


def program_releases(evaluation) -> dict[str, dict[str, Any]]:
    """Each release the program registered, by release name, with its inputs as the provider receives them."""
    from trainforge.platform.plan.first_up import _plain
    return {r.inputs["name"]: _plain(r.inputs) for r in evaluation.of_type(RELEASE)}


def rendered_program(evaluation) -> tuple[dict[str, list[dict[str, Any]]], dict[str, set[str]]]:
    """(objects each release creates, CRD kinds each release installs) for an evaluated program."""
    releases = program_releases(evaluation)
    return {n: render(r) for n, r in releases.items()}, {n: crd_kinds(r) for n, r in releases.items()}


def default_values(release_inputs: dict[str, Any]) -> dict[str, Any]:
    """The chart's default values as Helm sees them, each vendored subchart's defaults under its name."""
    import helm_python

    directory = chart_dir(chart_name(release_inputs), release_inputs["version"])
    values = dict(helm_python.Chart.load(directory).values)
    for dependency in yaml.load((directory / "Chart.yaml").read_text(), Loader=_Loader).get("dependencies") or []:
        sub = directory / "charts" / dependency["name"]
        if sub.is_dir():
            values[dependency["name"]] = merged(yaml.load((sub / "values.yaml").read_text(), Loader=_Loader) or {}, values.get(dependency["name"]) or {})
    return values


def values_schema(release_inputs: dict[str, Any]) -> dict[str, Any] | None:
    path = chart_dir(chart_name(release_inputs), release_inputs["version"]) / "values.schema.json"
    return json.loads(path.read_text()) if path.exists() else None
