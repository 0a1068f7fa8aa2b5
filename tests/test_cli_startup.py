"""The CLI starts fast: `--help` and `render` import neither torch, nor pulumi, nor mlflow."""

import subprocess
import sys

import pytest
from support.repo import REPO

HEAVY = ("torch", "pulumi", "pulumi_aws", "mlflow", "boto3", "optuna")


@pytest.mark.parametrize("argv", [["--help"], ["render", "examples/quickstart.yaml"], ["render", "examples/quickstart.yaml", "--kind", "pytorchjob"]])
def test_light_commands_import_nothing_heavy(argv):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "trainforge.trainer.cli", *argv],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert not (imported & set(HEAVY)), f"heavy imports on the CLI path: {imported & set(HEAVY)}"
