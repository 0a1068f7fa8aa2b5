"""The package installs and plans on the Pythons people and GPU machines run (issue 38, item 9): `requires-python`
admits 3.11 and later; a fresh 3.13 virtual environment takes the platform extra from the package index, and its
`trainforge` answers `--help` and gives the same `plan` as this (3.11) one. The runtime extra is proven on 3.11, where
the CPU torch wheel of this machine lies."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.lanes import full
from support.repo import REPO

pytestmark = pytest.mark.slow


def interpreter(version: str) -> str | None:
    """A working python<version>: pyenv's own build first (its shim on PATH fails where the version is not selected)."""
    candidates = [*sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}*/bin/python{version}"))), shutil.which(f"python{version}")]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv"], capture_output=True, timeout=60).returncode == 0:
            return candidate
    return None


def test_requires_python_admits_the_versions_gpu_machines_run():
    from packaging.specifiers import SpecifierSet
    spec = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    assert all(v in spec for v in ("3.11.7", "3.12.1", "3.13.0", "3.14.0")) and "3.10.13" not in spec, spec


def comparable(plan: dict) -> dict:
    """A plan without its timing, its lists in one order (the engine registers resources in completion order)."""
    return {k: sorted(json.dumps(x, sort_keys=True) for x in v) if isinstance(v, list) else v for k, v in plan.items() if k != "seconds"}


@full("installs the platform extra from the package index into a fresh 3.13 environment (about a minute)")
def test_a_313_environment_installs_the_platform_extra_and_plans_like_311(tmp_path):
    python = interpreter("3.13")
    if python is None:
        pytest.skip("no python3.13 on this machine (pyenv versions or PATH)")
    venv = tmp_path / "v313"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{REPO}[platform]"],
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    helped = subprocess.run([str(venv / "bin/trainforge"), "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "Usage: trainforge" in helped.stdout
    plans = {}
    for name, exe in (("3.13", venv / "bin/trainforge"), ("3.11", Path(sys.executable).with_name("trainforge"))):
        done = subprocess.run([str(exe), "plan", "--stack", "dev", "-o", "json"], capture_output=True, text=True, timeout=300, cwd=REPO)
        assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a mandatory policy verdict, the same on both
        plans[name] = (done.returncode, comparable(json.loads(done.stdout)))
    assert plans["3.13"] == plans["3.11"]
