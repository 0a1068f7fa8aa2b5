"""Fixtures every module shares, and the suite's two lanes.

- default lane (`pytest`, the README's test command): every kind of real proof at least once.
- full lane (`pytest --full`, what CI runs): also the tests marked `full` — a variant of a behaviour that keeps its
  proof in the default lane (another strategy, another stack, another kill point), and the benchmarks' quick modes.
- inner loop: `pytest -m "not slow"` — no real training, sweep or server start-up.

Tests run on two xdist workers (`-n 2` in pyproject's addopts; `-n 0` runs them in this process). Tests that must not
overlap each other share an xdist group (support/lanes.py) and run in turn on one worker.
"""

from __future__ import annotations

import os
import sys

import pytest
from support.evaluated import evaluation_of, typed_config
from support.repo import STACK_FILES
from support.servers import mlflow_server_starting
from support import run_cache, typecheck
from trainforge.trainer.launch import serve_workers_warm

# One intra-op thread per training process the tests start: two workers, each with up to two ranks or two trials at
# once, on two cores. Left at torch's default (a thread per core), their OpenMP pools spin against each other. torchrun
# sets the same for a node of several ranks; a single-rank job on a real node keeps every core.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The local supervisor starts every worker with PYTHONUNBUFFERED=1; the suite's own launches get it too, so that one
# warm worker interpreter (support.training) stands in for both (a fork cannot change how an interpreter started).
os.environ["PYTHONUNBUFFERED"] = "1"
# MLflow 3 reports usage to its makers unless told not to; it reads its "am I under pytest?" guard once, at import, and
# the warm worker interpreter imports MLflow before any test runs. Nothing the suite starts talks past loopback.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
# This machine's image (CI's may too) sets PYTHONDONTWRITEBYTECODE=1: then every interpreter the run starts (both
# workers, each cold CLI, `plan`, the servers' and the training processes' parents) compiled the package and the
# assert-rewritten test modules from source again — each worker's collection alone took 10 s, 6.5 s with the caches.
# The workers and everything they start inherit this; the caches go to __pycache__/ (git ignores them).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="run the full lane: also the tests marked `full` (variants and benchmarks' quick modes); CI runs it")


def full_lane_problems(items) -> list[str]:
    """A test moved to the full lane says why (`reason=`) and, when it is a variant, which default-lane test keeps the
    behaviour's proof (`kept_by=` a test function of the same module, or "itself": another parameter of the same
    test): moving a variant out never drops a behaviour."""
    default = {(item.module.__name__, item.originalname) for item in items if item.get_closest_marker("full") is None}
    problems = []
    for item in items:
        marker = item.get_closest_marker("full")
        if marker is None:
            continue
        if not marker.kwargs.get("reason"):
            problems.append(f"{item.nodeid}: @pytest.mark.full needs reason=")
        kept_by = marker.kwargs.get("kept_by")
        if kept_by == "itself":  # support.lanes.ITSELF
            kept_by = item.originalname
        if kept_by and (item.module.__name__, kept_by) not in default:
            problems.append(f"{item.nodeid}: kept_by={kept_by!r} is no default-lane test of {item.module.__name__}")
    return problems


def pytest_collection_finish(session):
    # The product's warm worker interpreter for this test process and what it starts: a worker launched directly (a
    # local job, a sweep trial, support.training's `run(nproc=1)`) or a bare runtime (`run(nproc=None)`) is forked
    # instead of importing torch again (tests/test_worker_forkserver.py proves forked = cold;
    # TRAINFORGE_WORKER_FORKSERVER=off keeps every worker cold). Not waited for: a worker launched before it listens
    # starts cold. The inner loop trains nothing and starts none.
    if any(item.get_closest_marker("slow") for item in session.items):
        serve_workers_warm(wait=False)


def mlflow_group_problems(items) -> list[str]:
    """Every test of the shared MLflow server is in its xdist group, so one worker, and one server, serves them all."""
    return [f"{item.nodeid}: uses mlflow_tracking, so it is marked TRAINING (support/lanes.py): one MLflow server per run"
            for item in items if "mlflow_tracking" in item.fixturenames and _group(item) != MLFLOW_GROUP]


def _group(item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return (marker.args[0] if marker.args else marker.kwargs.get("name")) if marker else None


def pytest_collection_modifyitems(config, items):
    problems = full_lane_problems(items) + mlflow_group_problems(items)
    if problems:
        raise pytest.UsageError("the full lane's rules:\n  " + "\n  ".join(problems))
    if config.getoption("--full"):
        return
    kept = [item for item in items if item.get_closest_marker("full") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("full") is not None])
        items[:] = kept


def pytest_configure(config):
    """The process that starts the run (not an xdist worker) makes the run's shared cache (support/run_cache.py) before
    any worker starts; the xdist controller (only with workers) starts mypy beside the tests: support/typecheck.py."""
    if hasattr(config, "workerinput"):
        return
    run_cache.start_run()
    if not config.getoption("numprocesses", None):
        return
    if typecheck.selected([str(a) for a in config.args], config.option.markexpr or "", config.invocation_params.dir):
        typecheck.start_in_background()


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        typecheck.stop()
        run_cache.end_run()


def pytest_report_header(config):
    lane = "full (everything)" if config.getoption("--full") else "default (tests marked `full` deselected; --full runs them)"
    return f"trainforge lane: {lane}"


def _has_mlflow_server() -> bool:
    """The full mlflow package (its tracking server), found without importing mlflow (seconds) into this process."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("mlflow")
    return spec is not None and spec.origin is not None and (Path(spec.origin).parent / "server").is_dir()


# The group whose tests use the shared MLflow server (mlflow_group_problems): the worker that runs it starts the server.
MLFLOW_GROUP = "training"
_MLFLOW: dict = {}


@pytest.fixture(autouse=True)
def _mlflow_starting(request, tmp_path_factory):
    """The shared MLflow server, started in the background (10-15 s, mostly imports) when this process runs its first
    test of the MLflow group, if any test of the run uses it; other tests run meanwhile. One server per run: the group
    runs on one worker."""
    if "wanted" not in _MLFLOW:
        _MLFLOW["wanted"] = any("mlflow_tracking" in item.fixturenames for item in request.session.items) and _has_mlflow_server()
    if _MLFLOW["wanted"] and "ready" not in _MLFLOW and _group(request.node) == MLFLOW_GROUP:
        starting = mlflow_server_starting(tmp_path_factory.mktemp("mlflow"))
        _MLFLOW["ready"] = starting.__enter__()
        request.session.config.add_cleanup(lambda: starting.__exit__(None, None, None))


@pytest.fixture(autouse=True)
def _studies_closed():
    """The optuna storages a test polled through (support/studies.py) closed when it ends."""
    yield
    if "support.studies" in sys.modules:
        sys.modules["support.studies"].close_all()


@pytest.fixture
def mlflow_tracking(_mlflow_starting):
    """A real MLflow tracking server (SQLite, no auth) shared by every test of the run (they are in one xdist group);
    each test keeps to its own job ids and sweep names. The servers with basic-auth, as the chart configures them, are
    test_tracking_auth's and test_platform_verify's."""
    if "ready" not in _MLFLOW:
        pytest.skip("the full mlflow package (tracking server) is not installed")
    return _MLFLOW["ready"]()


@pytest.fixture(scope="session")
def evaluations():
    """Every stack file, evaluated once per test run (evaluation_of)."""
    return evaluation_of


@pytest.fixture(params=STACK_FILES, ids=[p.name for p in STACK_FILES])
def stack(request, evaluations):
    """One evaluated stack (a new file in stacks/ is picked up with no test edit) and its typed config."""
    cfg = typed_config(request.param)
    # The tests loop over the stack's teams, node groups and GPU groups: a stack without them would pass them all
    # vacuously. A stack that means to have none needs tests of its own.
    assert cfg.teams and cfg.node_groups and any(g.has_gpus for g in cfg.node_groups), \
        f"{request.param.name}: the stack tests assume teams and GPU node groups to check"
    return evaluations(request.param), cfg
