"""The tests run the CLI forked from a pre-imported interpreter (tests/support/forkserver.py). That shortcut is only
sound while a forked invocation is indistinguishable from a cold one: same exit code, same stdout, same stderr, for
help, successful commands, refusals of bad input, unknown commands and options, and the environment and working
directory the caller gives."""

from __future__ import annotations

import os
import time

import pytest
from support import run_cache
import yaml
from support.cli import cold_cli, run_cli
from support.lanes import TIMING
from support.repo import REPO

QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


# name: (argv, working directory, environment over the test's)
CASES = {
    "help": (["--help"], REPO, {}),
    "help in a narrow terminal": (["--help"], REPO, {"COLUMNS": "60"}),
    "help in a wide terminal": (["--help"], REPO, {"COLUMNS": "140"}),
    "render": (["render", "examples/quickstart.yaml"], REPO, {}),
    "a relative path from another directory": (["render", "quickstart.yaml"], REPO / "examples", {}),
    "a missing file": (["render", "nowhere.yaml"], REPO, {}),
    "a refused field": (["render", "bad.yaml"], None, {}),
    "a file that is not YAML": (["submit", "not-yaml.yaml"], None, {}),
    "an unknown command": (["launch-rockets"], REPO, {}),
    "an unknown option": (["render", "examples/quickstart.yaml", "--colour", "blue"], REPO, {}),
    "no job of that name": (["status", "never-submitted"], REPO, {}),
    "the price table": (["prices", "show", "-o", "json"], REPO, {}),
}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """Each case run cold and forked, with the same home, directory and environment; once per run (both workers run
    tests of this module)."""
    return run_cache.once("cli-forked-cases", run_cache.digest(repr(sorted(CASES.items()))), lambda: run_both(tmp_path_factory.mktemp("forked")))


def run_both(tmp):
    (tmp / "bad.yaml").write_text(yaml.safe_dump({**QUICKSTART, "workers": {"nodes": 0, "procs_per_node": 1}}))
    (tmp / "not-yaml.yaml").write_text("name: [unclosed\n")
    out = {}
    for name, (argv, cwd, extra) in CASES.items():
        env = {**os.environ, "TRAINFORGE_HOME": str(tmp / "home"), "KUBECONFIG": str(tmp / "no-kubeconfig"), **extra}
        cold = cold_cli(*argv, env=env, cwd=cwd or tmp, timeout=120)
        forked = run_cli(*argv, env={"KUBECONFIG": str(tmp / "no-kubeconfig"), **extra}, home=tmp / "home", cwd=cwd or tmp, timeout=120)
        out[name] = (cold, forked)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_a_forked_invocation_is_a_cold_one(both, name):
    cold, forked = both[name]
    assert (forked.returncode, forked.stdout, forked.stderr) == (cold.returncode, cold.stdout, cold.stderr)


@pytest.mark.slow
def test_the_sample_covers_success_refusal_and_the_callers_environment(both):
    codes = {cold.returncode for cold, _ in both.values()}
    assert 0 in codes and 2 in codes, codes
    narrow, wide = both["help in a narrow terminal"][1].stdout, both["help in a wide terminal"][1].stdout
    assert max(map(len, narrow.splitlines())) <= 60 < max(map(len, wide.splitlines())), "each call gets its own COLUMNS"


@TIMING
def test_a_forked_invocation_is_fast():
    """Reported, not asserted (a busy machine is slower): the forked path against a cold interpreter, same command."""
    env = dict(os.environ)
    started = time.perf_counter()
    for _ in range(3):
        cold_cli("render", "examples/quickstart.yaml", env=env)
    cold = (time.perf_counter() - started) / 3
    started = time.perf_counter()
    for _ in range(3):
        run_cli("render", "examples/quickstart.yaml")
    forked = (time.perf_counter() - started) / 3
    print(f"render: cold {cold * 1000:.0f} ms, forked {forked * 1000:.0f} ms ({cold / forked:.1f}x)")
