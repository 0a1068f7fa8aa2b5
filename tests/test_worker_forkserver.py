"""A worker forked from the warm interpreter (trainer/forkserver.py, used by the node launcher where
TRAINFORGE_WORKER_FORKSERVER names one) is only a shortcut while it is indistinguishable from a cold worker: the same
trained bytes, the same exit codes for success, a user's error, a preemption and a vanished worker, the same records;
and a request the server cannot honour (another import-time environment, a module it did not import, no server at
all) runs cold instead of differently."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import training
from support.lanes import ITSELF, full
from support.repo import REPO
from support.servers import free_port
from support.waiting import wait_until

from trainforge import exits
from trainforge.trainer import forkserver
from trainforge.trainer.launch import RANK_PROXY, WORKER_FORKSERVER_ENV, worker_modules

pytestmark = pytest.mark.slow
FORKED = "forked from the warm interpreter"


@pytest.fixture(scope="module")
def server():
    address, process = forkserver.start(worker_modules())
    yield address
    process.kill()
    process.wait()


def launch(workdir: Path, server: str | None, *overrides: str, env: dict | None = None, nproc: int = 1) -> subprocess.Popen:
    """A job of `nproc` processes under the node launcher, with the worker fork server `server` (None: cold)."""
    workdir.mkdir(parents=True, exist_ok=True)
    environment = {k: v for k, v in os.environ.items() if k != WORKER_FORKSERVER_ENV}
    environment.update({WORKER_FORKSERVER_ENV: server} if server else {}, **(env or {}))
    return subprocess.Popen(training.command(workdir, list(overrides), nproc=nproc), cwd=workdir, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    out, _ = process.communicate(timeout=300)
    return process.returncode, out


def without_times(log: str) -> list[str]:
    """The worker's log lines as a reader compares them: no timestamps, speeds or measured machine facts."""
    keep = []
    for line in log.splitlines():
        if FORKED in line or " steps/s " in line or "host memory" in line:
            continue
        text = line.split(" ", 2)[-1] if line[:4].isdigit() else line
        keep.append(text.split(" (a bf16 matmul takes")[0])
    return keep


def comparable(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("precision_reason", "wall_s", "started_at", "ended_at")}


def test_a_forked_worker_trains_the_same_bytes_and_says_it_was_forked(tmp_path, server):
    cold_code, cold_log = finish(launch(tmp_path / "cold", None))
    forked_code, forked_log = finish(launch(tmp_path / "forked", server))
    assert (cold_code, forked_code) == (0, 0), cold_log[-2000:] + forked_log[-2000:]
    assert FORKED in forked_log and FORKED not in cold_log
    assert (tmp_path / "forked/run/final_model.pt").read_bytes() == (tmp_path / "cold/run/final_model.pt").read_bytes()
    assert comparable(training.result(tmp_path / "forked")) == comparable(training.result(tmp_path / "cold"))
    losses = [[json.loads(line).get("loss") for line in (tmp_path / which / "run/metrics.jsonl").read_text().splitlines()]
              for which in ("cold", "forked")]
    assert losses[0] == losses[1]
    assert without_times(forked_log) == without_times(cold_log)


def test_a_users_error_ends_a_forked_worker_as_it_ends_a_cold_one(tmp_path, server):
    bad = ("warmup_steps=100", "max_steps=50")  # refused by the run config: exit 2, not retried
    cold_code, cold_log = finish(launch(tmp_path / "cold", None, *bad))
    forked_code, forked_log = finish(launch(tmp_path / "forked", server, *bad))
    assert cold_code == forked_code == exits.EXIT_USER_ERROR, cold_log[-2000:]
    assert FORKED in forked_log
    assert without_times(forked_log) == without_times(cold_log)


@pytest.mark.parametrize("signum, code", [
    (signal.SIGTERM, exits.EXIT_PREEMPTED),
    pytest.param(signal.SIGKILL, exits.EXIT_WORKER_LOST, marks=full(
        "the other signal: the launcher learns a forked worker's end from the server either way", kept_by=ITSELF)),
], ids=["sigterm-preempted", "sigkill-lost"])
def test_a_signal_ends_a_forked_worker_with_the_code_a_cold_one_gets(tmp_path, server, signum, code):
    """SIGTERM to the launcher reaches the forked worker (an emergency checkpoint, 143); a worker SIGKILLed reads as
    lost (137), though the launcher learns of its end from the server, not from waitpid."""
    outcomes = {}
    for which, path in (("cold", None), ("forked", server)):
        workdir = tmp_path / which
        process = launch(workdir, path, "max_steps=100000", "step_sleep_s=0.02")
        training.wait_for_step(workdir, 5)
        if signum == signal.SIGTERM:
            process.send_signal(signum)
        else:
            os.kill(int(next((workdir / "run" / "pids").glob("*.pid")).read_text()), signum)
        outcomes[which] = finish(process)
    assert outcomes["cold"][0] == outcomes["forked"][0] == code, outcomes["forked"][1][-2000:]
    if signum == signal.SIGTERM:
        for which in ("cold", "forked"):
            assert json.loads((tmp_path / which / "run/result.json").read_text())["exit_code"] == exits.EXIT_PREEMPTED


def test_a_two_rank_job_forks_torchrun_and_each_rank_and_trains_the_same_bytes(tmp_path, server):
    """Two ranks under torchrun: the agent and each worker (through trainer/rank_proxy.py) forked, and the job
    indistinguishable from a cold one: the same bytes, results and log lines."""
    cold_code, cold_log = finish(launch(tmp_path / "cold", None, nproc=2))
    forked_code, forked_log = finish(launch(tmp_path / "forked", server, nproc=2))
    assert (cold_code, forked_code) == (0, 0), cold_log[-2000:] + forked_log[-2000:]
    said = [line for line in forked_log.splitlines() if FORKED in line]
    assert [line.split()[1] for line in said] == ["torchrun", "worker", "worker"], forked_log[-2000:]
    assert FORKED not in cold_log
    assert (tmp_path / "forked/run/final_model.pt").read_bytes() == (tmp_path / "cold/run/final_model.pt").read_bytes()
    assert comparable(training.result(tmp_path / "forked")) == comparable(training.result(tmp_path / "cold"))
    assert without_times(forked_log) == without_times(cold_log)


def test_sigterm_to_a_node_whose_forked_torchrun_waits_for_its_peers_is_a_preemption(tmp_path, server):
    """The launcher passes a signal on to a forked torchrun as to a cold one (tests/test_supervisor_rules.py): node 0
    of 2 waits in the rendezvous for a node that never comes, is told to stop, and says preempted."""
    log = tmp_path / "node.log"
    env = {**os.environ, WORKER_FORKSERVER_ENV: server}
    node = subprocess.Popen([sys.executable, "-m", "trainforge.trainer.launch", "--nproc-per-node=1", "--", "--nnodes=2",
                             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "json.tool"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until(lambda: any(line.startswith("trainforge: torchrun ") and FORKED in line for line in log.read_text().splitlines()),
                   60, interval=0.05, what="torchrun forked")
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == exits.EXIT_PREEMPTED, log.read_text()[-2000:]
    finally:
        kill_job(node, tmp_path)


def kill_job(launcher: subprocess.Popen, workdir: Path) -> None:
    """What a failed test leaves: the launcher's process group, and each worker's own (forked: out of the launcher's)."""
    workers = [int(p.read_text()) for p in (workdir / "run" / "pids").glob("*.pid")]
    for group in [launcher.pid, *workers]:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def rank_proxies(workdir: Path) -> list[int]:
    """The rank proxies torchrun started for the job running in `workdir`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if RANK_PROXY.encode() in argv and os.readlink(entry / "cwd") == str(workdir):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_rank_proxy_takes_its_forked_worker_with_it_and_the_node_reads_as_lost(tmp_path, server):
    """torchrun ends a worker it gave up on with SIGKILL to its process group, which only reaches the proxy: the
    server kills the worker it stands for (tied), so nothing trains on unwatched, and the node's code is the one a
    SIGKILLed cold worker gives (lost: retried)."""
    workdir = tmp_path / "forked"
    process = launch(workdir, server, "max_steps=100000", "step_sleep_s=0.02", nproc=2)
    try:
        training.wait_for_step(workdir, 5)
        workers = [int(p.read_text()) for p in sorted((workdir / "run" / "pids").glob("*.pid"))]
        proxies = rank_proxies(workdir)
        assert len(proxies) == 2 and not set(proxies) & set(workers), (proxies, workers)
        os.killpg(proxies[1], signal.SIGKILL)
        code, log = finish(process)
    finally:
        kill_job(process, workdir)
    assert code == exits.EXIT_WORKER_LOST, log[-2000:]
    wait_until(lambda: not any(alive(pid) for pid in workers), 60, what="both ranks' workers to end")


def test_a_rank_proxy_without_a_server_becomes_the_worker_itself(tmp_path):
    """No server to ask (or one that answers cold): the proxy execs the worker with torchrun's interpreter flags, in
    its own pid, exactly what torchrun would have started."""
    (tmp_path / "whoami.py").write_text("import os, sys\nprint(os.getpid(), sys.orig_argv[1], sys.argv[1:])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), WORKER_FORKSERVER_ENV: "@trainforge-forkserver-nobody"}
    process = subprocess.Popen([sys.executable, "-u", "-m", RANK_PROXY, "whoami", "--set", "a=1"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip().split(maxsplit=2) == [str(process.pid), "-u", "['--set', 'a=1']"], out


def test_another_import_time_environment_or_no_server_runs_cold(tmp_path, server):
    """OpenMP read its thread count when the server imported torch: a request with another one cannot be forked."""
    other, out = finish(launch(tmp_path / "other-threads", server, "max_steps=30", env={"OMP_NUM_THREADS": "2"}))
    assert other == 0 and FORKED not in out, out[-2000:]
    gone, out = finish(launch(tmp_path / "no-server", "@trainforge-forkserver-nobody", "max_steps=30"))
    assert gone == 0 and FORKED not in out, out[-2000:]


@contextlib.contextmanager
def serving(tmp_path: Path, module: str, source: str):
    """A fork server that has imported `module` (written from `source` into tmp_path); yields its address and the
    environment that finds the module."""
    (tmp_path / f"{module}.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    path, process = forkserver.start([module], env=env)
    try:
        yield path, env
    finally:
        process.kill()
        process.wait()


def test_the_server_forks_only_what_it_imported_and_ends_children_as_the_interpreter_does(tmp_path):
    """A module it did not import is answered `cold`; a child's non-daemon thread is joined and its atexit handlers run
    before it exits, as a cold interpreter's; an uncaught exception exits 1 with the traceback on stderr."""
    with serving(tmp_path, "ending", "import atexit, sys, threading, time\n"
                                     "from pathlib import Path\n"
                                     "def late():\n"
                                     "    time.sleep(0.2)\n"
                                     "    Path(sys.argv[1], 'thread').write_text('joined')\n"
                                     "if __name__ == '__main__':\n"
                                     "    atexit.register(lambda: Path(sys.argv[1], 'atexit').write_text('ran'))\n"
                                     "    threading.Thread(target=late).start()\n"
                                     "    if sys.argv[2] == 'raise':\n"
                                     "        raise ValueError('the child failed')\n"
                                     "    sys.exit(int(sys.argv[2]))\n") as (path, env):
        assert forkserver.spawn(path, "json.tool", [], env) is None, "json.tool was never imported by the server"
        for argument, expected in (("7", 7), ("raise", 1)):
            out_dir = tmp_path / argument
            out_dir.mkdir()
            with open(out_dir / "stderr", "w") as err:
                child = forkserver.spawn(path, "ending", [str(out_dir), argument], env, tmp_path, (0, 1, err.fileno()))
            assert child is not None
            assert child.wait(60) == expected
            assert (out_dir / "thread").read_text() == "joined" and (out_dir / "atexit").read_text() == "ran"
        assert "ValueError: the child failed" in (tmp_path / "raise" / "stderr").read_text()


def test_a_forked_child_can_be_signalled_as_soon_as_its_pid_is_known_and_its_end_is_always_told(tmp_path):
    """The pid is told only once the child has its own process group and a fresh interpreter's handlers: a SIGTERM to
    that group at once ends it by SIGTERM (not lost, nor the server's own handler's exit 0). Its session process
    ignores the signals a terminal sends its starter's group (Ctrl-C), so it still tells the caller how its child
    ended."""
    with serving(tmp_path, "napping", "import sys, time\n"
                                      "if __name__ == '__main__':\n"
                                      "    time.sleep(float(sys.argv[1]))\n"
                                      "    sys.exit(7)\n") as (path, env):
        for _ in range(5):
            child = forkserver.spawn(path, "napping", ["60"], env, tmp_path)
            assert child is not None
            os.killpg(child.pid, signal.SIGTERM)
            assert child.wait(60) == -signal.SIGTERM
        child = forkserver.spawn(path, "napping", ["1"], env, tmp_path)
        assert child is not None
        session = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(session, signum)
        assert child.wait(60) == 7, "the session process outlived Ctrl-C and told the child's own end"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_user_cannot_make_the_server_run_anything(server):
    """The socket is abstract (no file permissions): the server itself refuses a peer that is not its own user."""

    def asked_as(uid: int) -> bool:
        child = os.fork()
        if child == 0:  # only socket calls here, then out: nothing of pytest's runs in the fork
            try:
                os.setuid(uid)
                forked = forkserver.spawn(server, "trainforge.trainer.runtime", ["--help"], dict(os.environ), "/",
                                          (0, os.open(os.devnull, os.O_WRONLY), 2))
                os._exit(0 if forked is not None else 1)
            finally:
                os._exit(2)
        return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0

    assert not asked_as(65534), "nobody's request was forked"
    assert asked_as(os.getuid()), "the server's own user is served"


def test_a_local_sweep_forks_its_trials_from_its_own_warm_interpreter(tmp_path):
    """`trainforge sweep` (local, one-process trials) starts the server itself: its trials' logs say they were forked."""
    base = yaml.safe_load((REPO / "examples" / "sweep-base.yaml").read_text())
    base["hyperparameters"] = {**base["hyperparameters"], "max_steps": 60}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-lr.yaml").read_text())
    sweep.update(name="warm", base=str(tmp_path / "base.yaml"), sampler="random", pruner={"type": "none"}, max_trials=2,
                 max_parallel=1, seed=3)
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    env = {k: v for k, v in os.environ.items() if k not in (WORKER_FORKSERVER_ENV, "MLFLOW_TRACKING_URI")}
    done = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "sweep", str(tmp_path / "sweep.yaml"), "--poll", "0.2"],
                          env={**env, "TRAINFORGE_HOME": str(tmp_path / "home")}, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    logs = sorted((tmp_path / "home" / "jobs").glob("warm-t*/job.log"))
    assert len(logs) == 2 and all(FORKED in log.read_text() for log in logs), [log.read_text()[-1500:] for log in logs]


def test_a_warm_interpreter_started_without_waiting_is_awaited_before_the_first_worker_or_given_up_on_aloud():
    """`trainforge sweep` starts the server without waiting (a sweep refused for its warm start or a budget used to
    wait for torch's import first) and waits right before its first trial's submission: then a worker forks. A server that died meanwhile
    is said on stderr and no longer named, so workers start cold instead of asking nobody."""
    script = """
import os, sys
from trainforge.trainer import forkserver, launch
launch.serve_workers_warm(wait=False)
address = os.environ[launch.WORKER_FORKSERVER_ENV]
assert launch.warm_workers_ready(), "it started"
forked = forkserver.spawn(address, "trainforge.trainer.runtime", ["--help"], {**os.environ, "PYTHONUNBUFFERED": "1"}, "/",
                          (0, os.open(os.devnull, os.O_WRONLY), 2))
assert forked is not None and forked.wait() == 0, "a worker forks once it is ready"
assert launch.warm_workers_ready(), "nothing pending: at once"
os.environ.pop(launch.WORKER_FORKSERVER_ENV)
launch.serve_workers_warm(wait=False).kill()
assert not launch.warm_workers_ready() and launch.WORKER_FORKSERVER_ENV not in os.environ
"""
    env = {k: v for k, v in os.environ.items() if k != WORKER_FORKSERVER_ENV}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("trainforge: workers start cold: the fork server") == 1, done.stderr


def test_a_forked_torchruns_rendezvous_names_its_steps_as_torch_does():
    """The warm interpreter names rendezvous steps without `inspect.stack()` (trainer/warm_torchrun.py): the same name
    torch's own function gives, at every depth, and its fallback past the top of the stack."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from trainforge.trainer import warm_torchrun

    assert dynamic_rendezvous.get_method_name is warm_torchrun.method_name
    assert "trainforge.trainer.warm_torchrun" in worker_modules()

    def both(depth: int) -> tuple[str, str]:
        return warm_torchrun._TORCHS(depth), warm_torchrun.method_name(depth)

    def next_rendezvous(depth: int) -> tuple[str, str]:  # as the handler's _record is called from its methods
        return both(depth)

    for depth in (1, 2, 3):
        torchs, ours = next_rendezvous(depth)
        assert torchs == ours, depth
    assert next_rendezvous(2) == ("next_rendezvous", "next_rendezvous")
    assert both(10_000) == ("no_method_name", "no_method_name")
