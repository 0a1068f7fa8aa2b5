"""The suite's own rules, which keep it fast and honest on a busy two-core CI machine.

- Shared helpers live in tests/support/; no test module imports another test module (or conftest), so a module can
  run alone, on any xdist worker, in any order.
- No fixed sleeps: a wait for a process polls a real signal through support.waiting.wait_until, the one place that
  may call time.sleep. A sleep that is long enough here is a race on CI.
- xdist groups hold: a test marked with a group runs under an id carrying it, which is what sends the group to one worker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.lanes import TIMING
from support.repo import REPO

TESTS = REPO / "tests"
# Where time.sleep may be called, and why.
SLEEP_ALLOWED = {"support/waiting.py": "the polling primitive every wait goes through, between two looks at a real signal"}


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)


def _imported_modules(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_test_module_imports_another_test_module_or_conftest():
    wrong = []
    for path in _python_files():
        imported = _imported_modules(ast.parse(path.read_text()))
        wrong += [f"{path.relative_to(TESTS)} imports {m}" for m in sorted(imported) if m.startswith("test_") or m == "conftest"]
    assert wrong == [], "move what is shared into tests/support/: " + "; ".join(wrong)


def _sleeps(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "sleep" and isinstance(func.value, ast.Name) and func.value.id == "time") \
                    or (isinstance(func, ast.Name) and func.id == "sleep"):
                lines.append(node.lineno)
    return lines


def test_no_fixed_sleeps_outside_the_polling_primitive():
    wrong = []
    for path in _python_files():
        relative = str(path.relative_to(TESTS))
        if relative in SLEEP_ALLOWED:
            continue
        wrong += [f"{relative}:{line}" for line in _sleeps(ast.parse(path.read_text()))]
    assert wrong == [], "wait for a real signal with support.waiting.wait_until instead: " + ", ".join(wrong)


def test_the_sleep_rule_can_fail():
    assert _sleeps(ast.parse("import time\ntime.sleep(1)\n")) == [2]
    assert _sleeps(ast.parse("from time import sleep\nsleep(1)\n")) == [2]
    assert _sleeps(ast.parse("cmd = 'import time; time.sleep(60)'\n")) == [], "a child's source in a string is the child's business"
    assert all((TESTS / allowed).exists() for allowed in SLEEP_ALLOWED)


@TIMING
def test_an_xdist_group_reaches_the_scheduler(request):
    """`--dist loadgroup` sends a group to one worker by the `@<group>` suffix xdist gives its tests' ids. With pytest
    9.2 and xdist 3.8 the suffix was silently lost (pytest builds nodeid from another field), so every group was
    ignored: pyproject pins pytest below 9.2, and this fails if a version pair loses it again."""
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not on an xdist worker (-n 0): there is no scheduler to reach")
    if not request.config.getvalue("loadgroup"):
        pytest.skip("the workers were not started with --dist loadgroup")
    assert request.node.nodeid.endswith("@timing"), request.node.nodeid
