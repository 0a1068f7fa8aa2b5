"""The product code is lint-clean: ruff's error and likely-bug rules (pyproject [tool.ruff]), so an unused import, an
undefined name or a loop variable captured late fails the build where a reviewer might miss it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import typecheck
from support.repo import REPO

PRODUCT = ["src", "infra", "platform", "trainer", "policies"]


def test_the_product_code_passes_ruff():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *PRODUCT], capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_finds_what_it_is_there_for(tmp_path):
    """The check can fail: an undefined name in a module is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return undefined_name\n")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "F821" in result.stdout


@pytest.mark.slow
def test_the_product_code_type_checks():
    """mypy (with pydantic's plugin) over the package laid out as installed (scripts/typecheck): an optional value
    passed where one is required, a wrong argument type between modules, a renamed attribute."""
    returncode, output = typecheck.result()
    assert returncode == 0, output[-8000:]
