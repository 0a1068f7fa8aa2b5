"""The package works from a built wheel, not only from a checkout: the Kubernetes schema validator finds its CRD
schemas and the price table as package data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from support.repo import REPO

CHECK = """
import trainforge, trainforge.k8s_schema as s, trainforge.pricing as p
from trainforge.stackconfig import load_stack_file
from trainforge.trainer.spec import load_spec
from trainforge.trainer.placement import decide
from trainforge.trainer.render import render
assert "{site}" in trainforge.__file__, trainforge.__file__
spec = load_spec("{repo}/examples/llm-pretrain-efa.yaml")
job = render(spec, decide(spec, load_stack_file("{repo}/stacks/Pulumi.prod.yaml")), "trainjob")
assert s.problems(job) == [], s.problems(job)
job["spec"]["trainer"]["numProcsPerNode"] = 8
assert any("numProcsPerNode" in line for line in s.problems(job))
print(p.price_table().as_of)
"""


@pytest.mark.slow
def test_the_schema_validator_and_price_table_work_from_an_installed_wheel(tmp_path):
    # Built from a copy: setuptools' build/ directory in a checkout keeps files of modules that no longer exist.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                                                ".hypothesis", "runs", "out"))
    built = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(built), str(source)],
                   check=True, capture_output=True, text=True)
    (wheel,) = built.glob("trainforge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "trainforge/schemas/crds/trainer.kubeflow.org_trainjobs.yaml" in names and "trainforge/prices.yaml" in names
    # A fresh environment: the wheel installed into its own site directory, the dependencies seen through a .pth file
    # (a path, not a site directory, so the checkout's editable install is not activated).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], check=True)
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK.format(site=site, repo=REPO)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
