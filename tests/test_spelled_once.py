"""Every cross-layer fact is spelled once (issue 23): a name other code must agree on — a Secret, a ServiceAccount, a
label, a tag, a file in a run directory — is a constant in its home (trainforge/contract.py, paths.py, run_tags.py,
exits.py),
and every other module imports it. Read from the source's syntax tree: a string literal anywhere in the product code
equal to a home's distinctive value is a second spelling, which a rename would silently leave behind.

Distinctive: a value with '-', '.', '/', '_' or ':' in it. Plain words ('team', 'run', 'mlflow') are facts too, but as
literals they are mostly dictionary keys and prose that happen to match; they are left to review. A real
coincidence is allowed below, with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.repo import REPO

HOMES = tuple(REPO / "src" / "trainforge" / name for name in ("contract.py", "paths.py", "run_tags.py", "exits.py"))
PRODUCT = ("src/trainforge", "trainer", "platform", "infra", "policies")
DISTINCTIVE = set("-./_:")

# (value, module) -> why that literal is not the home's fact.
COINCIDENCES = {
    ("cluster-autoscaler", "src/trainforge/stackconfig/kubernetes.py"): "the chart's name (charts a stack may re-pin)",
    ("cluster-autoscaler", "platform/manifests/charts.py"): "the chart's release and upstream name",
    ("cluster-autoscaler", "platform/components/kubernetes.py"): "the chart table's key (charts.py)",
    ("kube-prometheus-stack", "src/trainforge/stackconfig/kubernetes.py"): "the chart's name (charts a stack may re-pin)",
    ("kube-prometheus-stack", "platform/manifests/charts.py"): "the upstream chart's own name",
    ("spent_usd", "trainer/cli/sweep.py"): "a key of the sweep status document, not the team settings' key",
    ("spent_usd", "trainer/sweeps/tracking.py"): "an MLflow metric of the sweep's run",
    ("spent_usd", "trainer/controllers/sweep.py"): "a key of the sweep status document",
    ("trainforge-sweeps", "platform/manifests/sweeps.py"): "the app label of the database bootstrap objects",
}


def facts() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for home in HOMES:
        for node in ast.parse(home.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id.isupper() and DISTINCTIVE & set(node.value.value):
                        found.setdefault(node.value.value, []).append(f"{home.stem}.{target.id}")
    return found


def literals(path: Path):
    """(value, line) of every string literal that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value, node.lineno


def test_every_distinctive_fact_is_spelled_in_its_home_only():
    known = facts()
    assert len(known) >= 30, "the homes' facts were read"
    second = []
    for folder in PRODUCT:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path in HOMES:
                continue
            module = str(path.relative_to(REPO))
            for value, line in literals(path):
                if value in known and (value, module) not in COINCIDENCES:
                    second.append(f"{module}:{line} spells {value!r}, which is {' / '.join(known[value])}")
    assert second == [], "import the constant instead:\n" + "\n".join(second)


API_VERSION = re.compile(r"^[a-z0-9-]+(\.[a-z0-9-]+)+/v\d+((alpha|beta)\d+)?$")


def test_an_api_version_is_spelled_once_even_inside_a_path_or_split_in_two():
    """Issue 40, item 6: the scan above compares whole literals, so `f"/apis/kueue.x-k8s.io/v1beta2/..."` and
    `("kueue.x-k8s.io", "v1beta2")` escaped it (the Kueue API version was in five modules). An API version's group
    alone, or the version inside a longer string (an f-string's text included), is a second spelling too."""
    versions = {v: homes for v, homes in facts().items() if API_VERSION.match(v)}
    assert len(versions) >= 3, versions
    second = []
    for folder in PRODUCT:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path in HOMES:
                continue
            for value, line in literals(path):
                for api, homes in versions.items():
                    inside = re.search(rf"(?<![\w.-]){re.escape(api)}(?!\w)", value)  # not kubeflow.org/v1 in trainer.kubeflow.org/v1alpha1
                    if value != api and (inside or value == api.rpartition("/")[0]):
                        second.append(f"{path.relative_to(REPO)}:{line} spells {value!r}, which holds {' / '.join(homes)}")
    assert second == [], "use the constant (contract.api_parts for its group and version):\n" + "\n".join(second)


def test_every_allowed_coincidence_is_still_there():
    """An allowance whose literal is gone is stale: it would excuse the next real second spelling."""
    present = {(value, str(path.relative_to(REPO))) for folder in PRODUCT for path in (REPO / folder).rglob("*.py")
               for value, _ in literals(path)}
    assert [c for c in COINCIDENCES if c not in present] == []


def test_the_check_finds_a_second_spelling(tmp_path):
    """The scan is not vacuous: a retyped Secret name is found."""
    module = tmp_path / "retyped.py"
    module.write_text('"""A docstring naming trainforge-mlflow is prose."""\nNAME = "trainforge-mlflow"\n')
    assert [v for v, _ in literals(module) if v in facts()] == ["trainforge-mlflow"]


def test_the_error_messages_explain_the_name_pattern_the_models_use():
    """errors.py stays free of pydantic (the CLI's --help imports it), so it keys its explanation by the pattern's text."""
    from trainforge import errors, models
    assert models.DNS_LABEL in errors.PATTERN_MEANING


EXIT_CALLS = {"Exit", "exit", "_exit", "SystemExit"}  # typer.Exit, sys.exit, os._exit, SystemExit


def exit_literals(path: Path):
    """(code, line) of every exit code given as a number: an `exit_code=` keyword, or the argument of an exit call
    (either branch of a conditional included)."""
    def numbers(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            yield node.value
        elif isinstance(node, ast.IfExp):
            yield from numbers(node.body)
            yield from numbers(node.orelse)
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        given = [k.value for k in node.keywords if k.arg == "exit_code"] + (node.args[:1] if name in EXIT_CALLS else [])
        for value in given:
            for code in numbers(value):
                yield code, node.lineno


def test_every_exit_code_is_a_named_constant():
    """Issue 40, item 6: an exit code is a contract with the scripts, the job's restart rules and the tests (errors.py:
    the CLI's; exits.py: the runtime's). Spelled as a number (`typer.Exit(3)`, `exit_code=1`) it cannot be found when
    the contract changes."""
    found = [f"{path.relative_to(REPO)}:{line} exits with the number {code}" for folder in PRODUCT
             for path in sorted((REPO / folder).rglob("*.py")) for code, line in exit_literals(path)]
    assert found == [], "name it (trainforge.errors.EXIT_*, trainforge.exits.EXIT_*):\n" + "\n".join(found)


def test_the_exit_code_check_sees_a_number(tmp_path):
    module = tmp_path / "exits.py"
    module.write_text("import typer\nraise typer.Exit(0 if ok else 3)\nraise Problem('', [], exit_code=1)\n")
    assert sorted(code for code, _ in exit_literals(module)) == [0, 1, 3]
