"""The design card's folders must not shadow anything: the stdlib `platform` module in particular."""

import subprocess
import sys

from support.repo import REPO


def test_stdlib_platform_is_not_shadowed_from_the_repository_root():
    code = "import platform, sys; print(platform.__file__); print(platform.python_version())"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    path, version = result.stdout.split()
    assert not path.startswith(str(REPO)), f"{path} shadows the standard library"
    assert version.startswith("3.")


def test_one_import_root_for_the_design_card_folders():
    code = ("import trainforge.stackconfig, trainforge.policies, trainforge.contract, trainforge.platform.training.runtime, "
            "trainforge.trainer.launch; import importlib.util as u; print(u.find_spec('infra'))")
    result = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "None", "a top-level `infra` package leaks out of the install"


def test_stack_config_reads_without_pulumi_or_torch():
    """The submitter reads quotas from stack files offline; that path must stay light."""
    code = ("import sys; from trainforge.stackconfig import load_stack_file; load_stack_file('stacks/Pulumi.prod.yaml');"
            "heavy = [m for m in ('pulumi', 'pulumi_aws', 'torch') if m in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_python_package_folder_is_installed():
    """A subpackage missing from pyproject's `packages` imports in an editable checkout and vanishes from a wheel."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    folders = {str(p.parent.relative_to(REPO)) for top in ("infra", "platform", "policies", "trainer", "src/trainforge")
               for p in (REPO / top).rglob("__init__.py") if ".venv" not in p.parts}
    assert folders <= listed, f"not in pyproject package-dir/packages: {sorted(folders - listed)}"


# ---- the import graph: dependencies point one way -------------------------------------------------------------

import ast  # noqa: E402

LAYER_FOLDERS = {"core": REPO / "src" / "trainforge", "infra": REPO / "infra", "platform": REPO / "platform",
                 "policies": REPO / "policies", "trainer": REPO / "trainer"}


def _module_name(path) -> str:
    """The import name of a source file, following pyproject's package-dir mapping."""
    for layer, root in LAYER_FOLDERS.items():
        if root in path.parents:
            parts = list(path.relative_to(root).with_suffix("").parts)
            prefix = ["trainforge"] if layer == "core" else ["trainforge", layer]
            return ".".join(prefix + [p for p in parts if p != "__init__"])
    raise ValueError(path)


def _sources():
    for layer, root in LAYER_FOLDERS.items():
        for path in root.rglob("*.py"):
            if layer == "core" and (REPO / "src" / "trainforge" / "platform") in path.parents:
                layer_of = "platform"  # the platform package's own __init__
            else:
                layer_of = layer
            yield layer_of, path


def _imports(path, module_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _layer(module: str) -> str | None:
    if module == "trainforge" or not module.startswith("trainforge."):
        return None
    second = module.split(".")[1]
    return second if second in ("infra", "platform", "policies", "trainer") else "core"


FORBIDDEN = {  # layer -> (trainforge layers it must not import, third-party packages it must not import)
    "core": ({"infra", "platform", "policies", "trainer"}, {"pulumi", "pulumi_aws", "pulumi_kubernetes", "torch"}),
    "infra": ({"platform", "policies", "trainer"}, {"torch"}),
    "platform": ({"trainer"}, {"torch"}),  # the plan (platform/plan) runs the policy pack
    "policies": ({"trainer", "infra", "platform"}, {"torch"}),
    "trainer": ({"infra", "platform", "policies"}, {"pulumi", "pulumi_aws", "pulumi_kubernetes", "pulumi_policy"}),
}


# The one sanctioned exception (DESIGN.md): the CLI's `plan` command loads the offline plan, inside the command.
ALLOWED = {("trainer/cli/plan.py", "trainforge.platform.plan"), ("trainer/cli/platform.py", "trainforge.platform.plan")}


def _function_level_only(path, prefix: str) -> bool:
    return not any(m.startswith(prefix) for m in _imports(path, module_level_only=True))


def test_dependencies_point_one_way():
    """core <- infra <- platform, core <- trainer, core <- policies; nothing below imports what is above it."""
    wrong = []
    for layer, path in _sources():
        relative = str(path.relative_to(REPO))
        for module in _imports(path):
            if any(relative == f and module.startswith(m) and _function_level_only(path, m) for f, m in ALLOWED):
                continue
            target = _layer(module)
            banned_layers, banned_packages = FORBIDDEN[layer]
            if target in banned_layers or module.split(".")[0] in banned_packages:
                wrong.append(f"{path.relative_to(REPO)} ({layer}) imports {module}")
    assert wrong == []


def test_the_cli_imports_no_torch_however_deep():
    """Every module the CLI reaches (its own imports at any depth, then their module-level imports) is torch-free."""
    by_name = {_module_name(path): path for _, path in _sources()}
    cli = [path for name, path in by_name.items() if name.startswith("trainforge.trainer.cli")]
    seen: set[str] = set()
    todo = [m for path in cli for m in _imports(path)]
    offenders = []
    while todo:
        module = todo.pop()
        if module in seen or module.startswith("trainforge.platform.plan"):  # the plan command's own, lazy world
            continue
        seen.add(module)
        if module.split(".")[0] == "torch":
            offenders.append(module)
        if module in by_name:
            todo += [m for m in _imports(by_name[module], module_level_only=True)]
    assert offenders == [], f"the CLI reaches {offenders}"
    assert "trainforge.trainer.spec" in seen and "trainforge.trainer.runtime.config" in seen, "the walk lost its way"


def test_the_manifests_are_pure_data_and_only_the_plan_runs_the_policy_pack():
    """platform/manifests builds plain dicts (so the tests, the plan and the CLI read them without an engine): no Pulumi
    there. The policy pack is run by the plan alone: nothing else in the platform imports it."""
    wrong = []
    for layer, path in _sources():
        relative = str(path.relative_to(REPO))
        for module in _imports(path):
            if relative.startswith("platform/manifests/") and module.split(".")[0].startswith("pulumi"):
                wrong.append(f"{relative} imports {module}")
            if layer == "platform" and _layer(module) == "policies" and not relative.startswith("platform/plan/"):
                wrong.append(f"{relative} imports {module}")
    assert wrong == []
