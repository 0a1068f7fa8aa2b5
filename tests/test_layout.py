"""The design card's folders must not shadow anything: the stdlib `platform` module in particular."""

import subprocess
import sys

from conftest import REPO


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
