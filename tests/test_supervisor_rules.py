"""How an attempt's end is read: from the codes each worker recorded (torchrun always says 1), by the node
launcher that is both the cluster pod's command and the local supervisor's."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge import exits
from trainforge.trainer.launch import (EXIT_WORKER_LOST, RANK_PROXY, WORKER_FORKSERVER_ENV, WORKER_FORKSERVER_OFF, classify,
                                       node_exit_code, through_rank_proxy)
from trainforge.exits import outcome_of

from support.servers import free_port
from support.waiting import wait_until


def record(tmp_path, **codes):
    for rank, code in codes.items():
        (tmp_path / f"{rank}.code").write_text(str(code))
    return tmp_path


@pytest.mark.parametrize("codes, expected, node_code", [
    ({"rank0": 0, "rank1": 0}, ("ok", 0), 0),
    ({"rank0": 2, "rank1": 2}, ("user_error", 2), 2),
    ({"rank0": 1, "rank1": exits.EXIT_PREEMPTED}, ("user_error", 1), 1),  # rank 0 crashed, torchrun stopped rank 1
    ({"rank0": exits.EXIT_PREEMPTED, "rank1": exits.EXIT_PREEMPTED}, ("retry", exits.EXIT_PREEMPTED), 143),
    # rank 0 was killed; torchrun then stopped rank 1 with SIGTERM, which looks like a preemption but is not one
    ({"rank0": EXIT_WORKER_LOST, "rank1": exits.EXIT_PREEMPTED}, ("retry", EXIT_WORKER_LOST), EXIT_WORKER_LOST),
    ({"rank0": exits.EXIT_PEER_LOST, "rank1": exits.EXIT_PREEMPTED}, ("retry", exits.EXIT_PEER_LOST), EXIT_WORKER_LOST),
    ({"rank0": 0, "rank1": exits.EXIT_PREEMPTED}, ("retry", exits.EXIT_PREEMPTED), 143),  # rank 0 had finished
    ({"rank0": 1}, ("retry", -9), EXIT_WORKER_LOST),  # rank 1 was killed; rank 0's collective then failed: the kill is the cause
    ({}, ("retry", -9), EXIT_WORKER_LOST),
])
def test_attempt_outcomes(tmp_path, codes, expected, node_code):
    returncode = 0 if expected[0] == "ok" else 1
    assert classify(returncode, record(tmp_path, **codes), world_size=2) == expected
    node = node_exit_code(returncode, tmp_path, world_size=2)
    assert node == node_code
    # The node's code alone carries the decision: Kubernetes' restart rules and the supervisor read only it.
    assert outcome_of(node) == expected[0]


def test_workers_that_all_recorded_success_make_a_success_whatever_torchrun_says(tmp_path):
    # torchrun exits 1 when a worker aborts in interpreter teardown after recording 0: the job is done.
    assert classify(1, record(tmp_path, rank0=0, rank1=0), world_size=2) == ("ok", 0)
    assert node_exit_code(1, tmp_path, world_size=2) == 0


def test_the_launcher_reading_the_records_while_a_rank_writes_them_never_sees_half_a_record(tmp_path):
    """The node launcher polls the records while its workers write them, and a rank may write its record twice (its
    preemption watcher records 143 when the grace runs out, while the main thread may record its own code). Seen in CI:
    the launcher read an empty code file, crashed with exit 1, and the cluster would have taken the attempt for a user
    error and never retried it."""
    rewrites = ("from trainforge.exits import record_exit\n"
                "for _ in range(500):\n    record_exit(143)\n    record_exit(1, 'boom')\n")
    writer = subprocess.Popen([sys.executable, "-c", rewrites], env={**os.environ, exits.EXIT_DIR_ENV: str(tmp_path), "RANK": "0"})
    seen = []
    while writer.poll() is None:
        seen.extend((r.code, r.message) for r in exits.read_exits(tmp_path))
    assert writer.returncode == 0
    assert seen, "the writer finished before a record was read: nothing was tried"
    assert {code for code, _ in seen} <= {143, 1}, "a record is whole or not there"
    assert all(message == "boom" for code, message in seen if code == 1), "a failure's code comes with its message"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.code", "rank0.error"], "nothing but the records left"


def lingering_agent(seconds: float) -> subprocess.Popen:
    """A real process standing in for a torchrun agent that has not exited yet."""
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_an_agent_that_lingers_after_its_workers_failed_is_stopped_after_the_grace(tmp_path):
    """Seen under load: node 1's worker SIGKILLed, node 0's worker recorded EXIT_PEER_LOST and exited, and node 0's
    torchrun agent then sat in its rendezvous shutdown for over 90 s, so the pod (and the job's restart) waited."""
    from trainforge.trainer.launch import wait_for_agent
    record(tmp_path, rank0=exits.EXIT_PEER_LOST)
    agent = lingering_agent(600)
    try:
        returncode = wait_for_agent(agent, tmp_path, nproc_per_node=1, grace_s=1.0)
    finally:
        agent.kill()
    assert returncode == -signal.SIGTERM, "stopped, not waited for"
    assert exits.is_retryable(node_exit_code(returncode, tmp_path, world_size=1)), "the records decide: the attempt is retried"


def test_an_agent_whose_workers_succeeded_or_still_run_is_waited_for(tmp_path):
    """Success: its agent may hold the exit barrier (and the store) for the other nodes. Still running: nothing is known."""
    from trainforge.trainer.launch import wait_for_agent
    record(tmp_path, rank0=0)
    assert wait_for_agent(lingering_agent(2.5), tmp_path, nproc_per_node=1, grace_s=0.5) == 0
    record(tmp_path, rank0=exits.EXIT_PEER_LOST)
    assert wait_for_agent(lingering_agent(2.5), tmp_path, nproc_per_node=2, grace_s=0.5) == 0, "rank 1 has not said yet"


def launch(*command, nproc=2, exit_dir=None):
    exit_dir = [f"--exit-dir={exit_dir}"] if exit_dir else []
    return [sys.executable, "-m", "trainforge.trainer.launch", f"--nproc-per-node={nproc}", *exit_dir, "--", "--standalone",
            "-m", "trainforge.trainer.launch", "--rank", "--", *command]


def python(code):
    return ["python", "-c", code]


@pytest.mark.slow
def test_the_launcher_exits_with_a_users_own_code_not_torchruns_1_and_leaves_no_files(tmp_path):
    crash = "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run(launch(*python(crash)), capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 3
    # Its exit records and torchrun's log directory (torchrun alone leaves a torchelastic_* per run) are gone.
    assert list(scratch.iterdir()) == [], "a local run or a sweep's trials would fill /tmp"


@pytest.mark.slow
def test_a_worker_killed_by_a_signal_makes_the_node_retryable():
    # Rank 1 is still running when rank 0 dies, so torchrun stops it with SIGTERM and it records 143: the node must
    # still say "worker lost" (counted against restarts), not "preempted" (uncounted), or an OOM loop never ends.
    kill = "import os, signal, time; os.kill(os.getpid(), signal.SIGKILL) if os.environ['RANK'] == '0' else time.sleep(60)"
    done = subprocess.run(launch(*python(kill)), capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_WORKER_LOST and exits.is_retryable(done.returncode), done.stderr[-3000:]


@pytest.mark.slow
def test_sigterm_to_the_node_is_forwarded_and_reported_as_preempted(tmp_path):
    started = tmp_path / "started"
    started.mkdir()
    sleeper = f"import os, pathlib, time; pathlib.Path({str(started)!r}, os.environ['RANK']).touch(); time.sleep(60)"
    node = subprocess.Popen(launch(*python(sleeper), exit_dir=tmp_path / "exits"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    wait_until(lambda: len(list(started.iterdir())) == 2, 60, interval=0.1, what="both ranks to start")
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=60) == exits.EXIT_PREEMPTED
    # Both ranks got the signal (the runtime's emergency checkpoint depends on it) and said so.
    assert sorted(p.read_text() for p in (tmp_path / "exits").glob("rank*.code")) == ["143", "143"]


@pytest.mark.slow
@pytest.mark.parametrize("grace, takes, finished", [
    (12, 3, True),  # done within grace - 5 s: torchrun waits, and each rank records its preemption
    (8, 8, False),  # still at it past grace - 5 s: torchrun SIGKILLs it, as the kubelet would have
])
def test_torchrun_waits_for_the_workers_emergency_work_as_long_as_the_pods_grace_allows(tmp_path, grace, takes, finished):
    """torchrun's own wait is 30 s, shorter than either grace class's window: an emergency checkpoint that took longer
    was SIGKILLed half-written. The node's environment (a pod's, the local backend's) gives torchrun the pod's grace
    period less a margin, through the launcher, cold or forked."""
    from trainforge import contract
    started = tmp_path / "started"
    started.mkdir()
    emergency = (f"import os, pathlib, signal, time\n"
                 f"signal.signal(signal.SIGTERM, lambda *_: (time.sleep({takes}), os._exit({exits.EXIT_PREEMPTED})))\n"
                 f"pathlib.Path({str(started)!r}, os.environ['RANK']).touch()\n"
                 "time.sleep(120)\n")
    node = subprocess.Popen(launch(*python(emergency), exit_dir=tmp_path / "exits"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, **contract.torchrun_environment(grace)})
    wait_until(lambda: len(list(started.iterdir())) == 2, 60, interval=0.1, what="both ranks to start")
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=60) == exits.EXIT_PREEMPTED, "the node was told to stop: a preemption either way"
    records = sorted(p.read_text() for p in (tmp_path / "exits").glob("rank*.code"))
    assert records == (["143", "143"] if finished else []), node.stdout.read().decode()[-3000:] if node.stdout else ""


def children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("torchrun_args, through_proxy", [
    (["--standalone", "--nnodes=1", "-m", "trainforge.trainer.runtime", "--set", "x=1"], True),
    (["--nnodes=2", "--rdzv-endpoint=h:1", "-m", "pkg.mod"], True),
    (["--no-python", "-m", "pkg.mod"], False),  # no interpreter of torchrun's to stand in for
    (["--standalone", "train.py", "-m", "x"], False),  # a script: `-m` is the script's own argument
    (["--nnodes", "2", "-m", "pkg.mod"], False),  # an option's value apart from it: not read, left alone
    (["--standalone", "-m"], False),
])
def test_only_a_workers_module_goes_through_the_rank_proxy(torchrun_args, through_proxy):
    rewritten = through_rank_proxy(torchrun_args)
    if through_proxy:
        at = torchrun_args.index("-m") + 1
        assert rewritten == [*torchrun_args[:at], RANK_PROXY, *torchrun_args[at:]]
    else:
        assert rewritten == torchrun_args


@pytest.mark.slow
def test_sigterm_before_the_workers_are_up_is_still_a_preemption(tmp_path):
    # Node 0 of 2 waits in the rendezvous for a node that never comes, so no worker ever starts or records a code.
    # torchrun cold, as on the cluster (tests/test_worker_forkserver.py has the same with torchrun forked).
    env = {**os.environ, WORKER_FORKSERVER_ENV: WORKER_FORKSERVER_OFF}
    node = subprocess.Popen([sys.executable, "-m", "trainforge.trainer.launch", "--nproc-per-node=1", "--", "--nnodes=2",
                             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "json.tool"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    # The launcher is up once torchrun is its child (its handlers are set before torchrun starts).
    wait_until(lambda: children_of(node.pid), 60, interval=0.05, what="the launcher to start torchrun")
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=60) == exits.EXIT_PREEMPTED


def test_a_missing_command_is_a_user_error(tmp_path):
    code = subprocess.run(launch("no-such-program-trainforge", nproc=1), capture_output=True, text=True, timeout=120)
    assert code.returncode == 127 and "no-such-program-trainforge" in code.stderr


def test_the_launcher_refuses_to_start_without_a_worker_count():
    out = subprocess.run([sys.executable, "-m", "trainforge.trainer.launch", "--", "-m", "x"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "--nproc-per-node" in out.stderr


def test_only_a_collective_failing_on_a_lost_peer_is_not_the_ranks_fault():
    pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    from trainforge.trainer.runtime.__main__ import exit_code_for

    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:2792: Connection reset by peer")
    assert exit_code_for(gloo) == exits.EXIT_PEER_LOST and exits.is_retryable(exits.EXIT_PEER_LOST)
    assert exit_code_for(RuntimeError("my database: Connection reset by peer")) == 1, "the user's own socket is the user's error"
    gone = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.3.7]:2792: Connection timed out")
    assert exit_code_for(gone) == exits.EXIT_PEER_LOST, "a host gone from the network: TCP gave up before gloo"
    import torch.distributed as dist
    misuse = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for details)"
                                   "\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.")
    assert exit_code_for(misuse) == 1, "NCCL says the job's collectives disagree: retrying meets the same"
    remote = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error"
                                   "\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")
    assert exit_code_for(remote) == exits.EXIT_PEER_LOST
    assert exit_code_for(ValueError("shapes do not match")) == 1
    assert exit_code_for(SystemExit(exits.EXIT_USER_ERROR)) == exits.EXIT_USER_ERROR


# Rank 0 all-reduces with a peer that is alive but never joins: what a node that vanished without resetting its
# connections looks like from the survivors (gloo's timeout, here 2 s instead of the runtime's minutes).
SILENT_PEER = """
import datetime, os, sys
import torch, torch.distributed as dist
from trainforge.trainer.runtime.__main__ import exit_code_for
rank, directory = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(directory, "store"), 2), rank=rank, world_size=2)
group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=2))
if rank == 1:
    sys.stdin.read()  # silent until the test closes its stdin
    os._exit(0)
for attempt in range(2):  # the second: gloo closed the pair after the first's timeout
    try:
        dist.all_reduce(torch.ones(1), group=group)
    except RuntimeError as exc:
        print(exit_code_for(exc), str(exc).replace("\\n", " "), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_a_collective_timing_out_on_a_silent_peer_is_a_retry_as_nccls_timeout_is(tmp_path):
    """A lost node's peers see gloo's timeout, not a reset. It was read as the job's own bug (exit 1: a TrainJob under
    `restartPolicy: ExitCode` failed for good); NCCL's timeout aborts the process, which reads as a lost worker."""
    script = tmp_path / "silent_peer.py"
    script.write_text(SILENT_PEER)
    silent = subprocess.Popen([sys.executable, str(script), "1", str(tmp_path)], stdin=subprocess.PIPE, text=True)
    try:
        survivor = subprocess.run([sys.executable, str(script), "0", str(tmp_path)], capture_output=True, text=True, timeout=120)
    finally:
        silent.communicate(input="", timeout=60)
    said = [line.partition(" ") for line in survivor.stdout.splitlines()]
    assert len(said) == 2 and "Timed out waiting" in said[0][2] and "pair closure" in said[1][2], survivor.stdout + survivor.stderr
    assert [int(code) for code, _, _ in said] == [exits.EXIT_PEER_LOST] * 2


def test_bundled_task_names_and_arguments_known_without_torch_match_the_factories():
    """The CLI checks `entry.task` and `entry.args` against config.BUNDLED_TASKS; the factories are the truth."""
    import inspect

    from trainforge.trainer.runtime.config import BUNDLED_TASKS
    from trainforge.trainer.runtime.tasks import BUNDLED
    assert set(BUNDLED_TASKS) == set(BUNDLED)
    for name, factory in BUNDLED.items():
        parameters = inspect.signature(factory).parameters
        assert set(BUNDLED_TASKS[name]) == set(parameters), name
        for arg, kind in BUNDLED_TASKS[name].items():
            assert kind.__name__ == str(parameters[arg].annotation).removeprefix("<class '").removesuffix("'>"), (name, arg)


def test_the_metrics_a_sweep_may_optimise_are_the_ones_each_task_reports():
    from trainforge.trainer.runtime.config import BUNDLED_DEFAULT_METRIC, BUNDLED_TASK_METRICS
    from trainforge.trainer.runtime.tasks import BUNDLED
    for name, factory in BUNDLED.items():
        task = factory()
        assert BUNDLED_TASK_METRICS[name] == tuple(task.metrics), name
        assert BUNDLED_DEFAULT_METRIC[name] == tuple(task.default_metric), name


def test_one_standalone_worker_is_launched_without_torchrun_and_anything_else_through_it(monkeypatch):
    """Trial start-up (issue 25): torchrun's agent costs a second of every short trial; one worker on a standalone node
    runs directly (with the environment torchrun would give it), every other shape through torchrun."""
    import sys

    from trainforge.trainer.launch import VIA_TORCHRUN_ENV, worker_directly
    runtime = ["-m", "trainforge.trainer.runtime", "--set", "max_steps=1"]
    assert worker_directly(["--standalone", "--nnodes=1", *runtime], 1) == [sys.executable, *runtime]
    assert worker_directly(["--standalone", "--nnodes=1", *runtime], 2) is None, "two workers need their agent"
    assert worker_directly(["--nnodes=2", "--rdzv-backend=c10d", *runtime], 1) is None, "a multi-node rendezvous needs torchrun"
    assert worker_directly(runtime, 1) is None, "a pod's node (its PET_* rendezvous) goes through torchrun"
    monkeypatch.setenv(VIA_TORCHRUN_ENV, "1")
    assert worker_directly(["--standalone", "--nnodes=1", *runtime], 1) is None



def test_every_state_a_backend_reports_is_a_phase_the_controller_knows():
    """One set of job states for both backends, the views and the sweep controller (issue 23): the Kubernetes
    conditions map onto it, the local records' states are in it, and what counts as ended is decided once."""
    from trainforge.trainer.backends import JobPhase
    from trainforge.trainer.backends.kubernetes import job_state
    from trainforge.trainer.backends.local_records import ACTIVE
    from trainforge.trainer.sweeps.controller import TERMINAL
    for conditions in ([], [("Suspended", "True")], [("Running", "True")], [("Restarting", "True")], [("Complete", "True")],
                       [("Failed", "True")]):
        assert isinstance(job_state("trainjob", {"status": {"conditions": [{"type": t, "status": v} for t, v in conditions]}}), JobPhase)
    assert {JobPhase(s) for s in ACTIVE} <= set(JobPhase) and not any(JobPhase(s).ended for s in ACTIVE)
    assert TERMINAL == {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED, JobPhase.DELETED, JobPhase.LOST}
    assert "succeeded" in TERMINAL and JobPhase.SUCCEEDED == "succeeded", "a record's string still compares"
