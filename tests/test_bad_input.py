"""Every bad input gets a clear error: the exit code the README promises, a message that names the field (or file)
and the fix, no traceback, nothing created, and nothing that was there before lost or changed.

Each case runs the real CLI in a fresh process with its own TRAINFORGE_HOME; the home's files are fingerprinted
before and after. Cases are grouped by what is bad: the job spec (one field at a time, from the quickstart), the file
itself (size, aliases, encoding), names given on the command line, numbers given as options, the sweep spec, the
stack file, and the state a previous run left behind.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.cli import run_cli
from support.repo import REPO

QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
DEV = str(REPO / "stacks" / "Pulumi.dev.yaml")
SWEEP = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-lr.yaml").read_text())
MAX_MESSAGE = 4000  # characters: a message quoting a pasted megabyte must not flood the terminal


def cli(home: Path, *argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_cli(*argv, home=home, env={"KUBECONFIG": str(home.parent / "no-kubeconfig")}, cwd=cwd, timeout=120)


def fingerprint(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def assert_refused(result: subprocess.CompletedProcess, names: str, exit_code: int = 2) -> str:
    message = result.stderr
    assert result.returncode == exit_code, f"exit {result.returncode}, wanted {exit_code}:\n{message[-3000:]}\n{result.stdout[-2000:]}"
    assert "Traceback" not in message, message[-3000:]
    assert names in message, f"the message does not name {names!r}:\n{message[-3000:]}"
    assert "Fix" in message, f"the message gives no fix:\n{message[-3000:]}"
    assert len(message) < MAX_MESSAGE, f"a {len(message)}-character message"
    return message


def with_path(document: dict, dotted: str, value) -> dict:
    """A copy of `document` with the field at `dotted` set (or removed, for value DELETE)."""
    out = json.loads(json.dumps(document))
    *parents, leaf = dotted.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return out


DELETE = object()

# (field, value, what the message must name). Each runs through `check` against the dev stack and `render`.
BAD_FIELDS = [
    ("name", "Quick Start", "name"), ("name", "../escape", "name"), ("name", "x" * 41, "name"), ("name", "", "name"),
    ("name", 12, "name"), ("name", DELETE, "name"), ("team", "Vision", "team"), ("team", DELETE, "team"),
    ("team", "a/b", "team"), ("entry", {}, "entry"), ("entry", {"task": "char_lm", "command": ["python", "x.py"]}, "entry"),
    ("entry.task", "char-lm", "entry.task"), ("entry.task", 7, "entry.task"), ("entry.args", {"contxt": 64}, "entry.args"),
    ("entry.args", ["context"], "entry.args"), ("workers.nodes", 0, "workers.nodes"), ("workers.nodes", 513, "workers.nodes"),
    ("workers.nodes", -1, "workers.nodes"), ("workers.nodes", 1.5, "workers.nodes"), ("workers.nodes", "two", "workers.nodes"),
    ("workers.procs_per_node", 0, "workers.procs_per_node"), ("workers.procs_per_node", 65, "workers.procs_per_node"),
    ("workers.threads", 4, "workers.threads"), ("resources.instance_type", "g6.huge", "resources.instance_type"),
    ("resources.instance_type", 5, "resources.instance_type"), ("resources.cpu", "-1", "resources.cpu"),
    ("resources.cpu", "lots", "resources.cpu"), ("resources.memory", "12 gigs", "resources.memory"),
    ("resources.memory", "-12Gi", "resources.memory"), ("resources.gpu", "h100", "resources"),
    # Zero is no limit and counts as nothing for the quotas (issue 37, item 5); `check` of such a job used to crash.
    ("resources.cpu", "0", "resources.cpu"), ("resources.cpu", "0m", "resources.cpu"), ("resources.memory", "0", "resources.memory"),
    ("resources.memory", "0.0Gi", "resources.memory"), ("resources.ephemeral_storage", "0Gi", "resources.ephemeral_storage"),
    # Hostile values (issue 37): each refused with the field and the fix, nothing rendered.
    ("limits.max_runtime", "9999999999999999999d", "limits.max_runtime"), ("limits.max_runtime", "367d", "limits.max_runtime"),
    ("checkpoint.interval_steps", 10 ** 400, "checkpoint.interval_steps"),
    ("tracking.experiment", "../other-team", "tracking.experiment"), ("tracking.experiment", "a\nb", "tracking.experiment"),
    ("tracking.experiment", "x\u202egnp.exe", "tracking.experiment"), ("tracking.experiment", "x" * 200_000, "tracking.experiment"),
    ("tracking.lineage", {"dataset": "v1\nINFO forged log line"}, "tracking.lineage"),
    ("tracking.lineage", {"dataset": "\u202eevil"}, "tracking.lineage"), ("tracking.lineage", {"../key": "v"}, "tracking.lineage"),
    ("tracking.lineage", {"dataset": "x" * 200_000}, "tracking.lineage"),
    ("capacity", "cheap", "capacity"), ("capacity", None, "capacity"), ("checkpoint.interval_steps", 0, "checkpoint.interval_steps"),
    ("checkpoint.interval_steps", -10, "checkpoint.interval_steps"), ("checkpoint.keep_last", 0, "checkpoint.keep_last"),
    ("checkpoint.s3_uri", "http://bucket/x", "checkpoint.s3_uri"), ("checkpoint.s3_uri", "s3://../x", "checkpoint.s3_uri"),
    ("checkpoint.every", 5, "checkpoint.every"), ("tracking.experiment", ["a"], "tracking.experiment"),
    ("tracking.server", "http://x", "tracking.server"), ("limits.max_runtime", "forever", "limits.max_runtime"),
    ("limits.max_runtime", "0m", "limits.max_runtime"), ("limits.max_runtime", "0h0m0s", "limits.max_runtime"),
    ("limits.max_runtime", "-1h", "limits.max_runtime"), ("limits.max_runtime", 60, "limits.max_runtime"),
    ("limits.max_runtime", "", "limits.max_runtime"), ("limits.max_cost_usd", -1, "limits.max_cost_usd"),
    ("limits.max_cost_usd", 0, "limits.max_cost_usd"), ("limits.max_cost_usd", float("inf"), "limits.max_cost_usd"),
    ("limits.max_cost_usd", float("nan"), "limits.max_cost_usd"), ("limits.max_cost_usd", "ten", "limits.max_cost_usd"),
    ("limits.max_restarts", -1, "limits.max_restarts"), ("limits.max_restarts", 101, "limits.max_restarts"),
    ("priority", "urgent", "priority"), ("hyperparameters.lr", float("inf"), "hyperparameters.lr"),
    ("hyperparameters.lr", float("-inf"), "hyperparameters.lr"), ("hyperparameters.lr", float("nan"), "hyperparameters.lr"),
    ("hyperparameters.lr", 0, "hyperparameters.lr"), ("hyperparameters.lr", -0.1, "hyperparameters.lr"),
    ("hyperparameters.lr", "fast", "hyperparameters.lr"), ("hyperparameters.max_steps", 0, "hyperparameters.max_steps"),
    ("hyperparameters.max_steps", -5, "hyperparameters.max_steps"), ("hyperparameters.max_steps", 1.5, "hyperparameters.max_steps"),
    ("hyperparameters.batch_size", 0, "hyperparameters.batch_size"), ("hyperparameters.precision", "fp7", "hyperparameters.precision"),
    ("hyperparameters.max_stepz", 100, "hyperparameters.max_stepz"), ("hyperparameters.warmup_steps", 10_000, "hyperparameters"),
    ("hyperparameters.min_lr_ratio", 2, "hyperparameters.min_lr_ratio"), ("hyperparameters.weight_decay", float("nan"), "hyperparameters.weight_decay"),
    ("hyperparameters.grad_clip", float("inf"), "hyperparameters.grad_clip"), ("hyperparameters", ["lr", 0.1], "hyperparameters"),
    ("surprise", True, "surprise"), ("entry", {"command": ["python", "train.py"], "args": {"layers": 4}}, "entry.args"),
]


def spec_file(tmp_path: Path, document) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    return path


@pytest.mark.parametrize("field,value,names", BAD_FIELDS, ids=[f"{f}={str(v)[:20]}" for f, v, _ in BAD_FIELDS])
def test_a_bad_field_is_refused_by_check_and_render_with_nothing_created(tmp_path, field, value, names):
    path = spec_file(tmp_path, with_path(QUICKSTART, field, value))
    home = tmp_path / "home"
    assert_refused(cli(home, "check", str(path), "--stack", DEV), names)
    assert_refused(cli(home, "render", str(path)), names)
    assert not home.exists()


def write_bytes(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    return path


def alias_bomb() -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):  # 9^9 values once expanded, from 1 KB
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]")
    return "\n".join(lines) + "\nname: bomb\nteam: vision\nentry: {task: classifier}\nhyperparameters: {lr: *i}\n"


BAD_FILES = {
    "an alias bomb": (lambda: alias_bomb().encode(), "alias"),
    "a harmless alias": (lambda: b"name: &n quick\nteam: vision\nentry: {task: classifier}\ntracking: {experiment: *n}\n", "alias"),
    "a 2 MiB file": (lambda: yaml.safe_dump(QUICKSTART).encode() + b"#" + b"x" * (2 << 20) + b"\n", "MiB"),
    "a 1 MB name": (lambda: yaml.safe_dump({**QUICKSTART, "name": "n" * 900_000}).encode(), "name"),
    "not YAML": (lambda: b"name: [quick\n", "not valid YAML"),
    "binary": (lambda: bytes(range(256)) * 4, "job.yaml"),
    "a list": (lambda: b"- name: quick\n", "mapping"),
    "a number": (lambda: b"42\n", "mapping"),
    "empty": (lambda: b"", "mapping"),
    "a tab-indented file": (lambda: b"name: quick\nentry:\n\ttask: classifier\n", "not valid YAML"),
    "a duplicate-free but unknown document": (lambda: b"job: {name: quick}\n", "job"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_refused_before_it_is_parsed_at_length(tmp_path, case):
    make, names = BAD_FILES[case]
    path = write_bytes(tmp_path, make())
    home = tmp_path / "home"
    for argv in (["check", str(path), "--stack", DEV], ["render", str(path)], ["submit", "--detach", str(path)]):
        assert_refused(cli(home, *argv), names)
    assert not home.exists()


def test_a_spec_file_that_is_missing_or_a_directory_is_named(tmp_path):
    home = tmp_path / "home"
    assert_refused(cli(home, "check", str(tmp_path / "absent.yaml"), "--stack", DEV), "absent.yaml")
    assert_refused(cli(home, "render", str(tmp_path)), str(tmp_path))
    assert not home.exists()


BAD_NAMES = ["../x", "../../etc", "a/b", "/etc/passwd", ".", "..", "UPPER", "x" * 41, "-lead", "trail-", "a b", "é"]


@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n)[1:-1][:12] for n in BAD_NAMES])
def test_a_job_name_that_is_not_a_name_never_becomes_a_path(tmp_path, command, name):
    home = tmp_path / "home"
    (home / "jobs").mkdir(parents=True)
    before = fingerprint(tmp_path)
    assert_refused(cli(home, command, "--", name), "job name")  # after --: a name like -lead is not an option
    assert fingerprint(tmp_path) == before


@pytest.mark.parametrize("command", ["status", "best", "report", "cancel"])
@pytest.mark.parametrize("name", ["../x", "nope"])
def test_a_sweep_name_that_does_not_exist_is_named_not_traced_back(tmp_path, command, name):
    home = tmp_path / "home"
    assert_refused(cli(home, "sweep", command, name), "sweep")
    assert not home.exists()


@pytest.mark.parametrize("region", ["../../x", "us-east-1/../..", "US-EAST-1", ""])
def test_a_region_that_is_not_a_region_is_refused_before_aws_is_asked(tmp_path, region):
    home = tmp_path / "home"
    assert_refused(cli(home, "prices", "refresh", "--region", region), "region")
    assert not home.exists()


@pytest.mark.parametrize("spent", ["nan", "inf", "-1", "-1e9", "1e400"])
@pytest.mark.parametrize("command", ["check", "submit"])
def test_a_spend_that_is_not_an_amount_is_refused(tmp_path, command, spent):
    home = tmp_path / "home"
    path = spec_file(tmp_path, QUICKSTART)
    assert_refused(cli(home, command, str(path), "--stack", DEV, f"--spent={spent}"), "--spent")
    assert not home.exists()


def test_a_local_job_larger_than_the_machine_is_refused_before_a_process_starts(tmp_path):
    home = tmp_path / "home"
    path = spec_file(tmp_path, {**QUICKSTART, "workers": {"nodes": 512, "procs_per_node": 64}})
    for argv in (["submit", str(path)], ["submit", "--detach", str(path)]):
        message = assert_refused(cli(home, *argv), "workers")
        assert "32768 processes" in message
    assert not home.exists()


BAD_SWEEPS = [
    ("max_trials", 0, "max_trials"), ("max_parallel", 0, "max_parallel"), ("max_parallel", 64, "max_parallel"),
    ("sampler", "genetic", "sampler"), ("objective.direction", "up", "objective.direction"),
    ("objective.metric", "", "objective.metric"), ("space", {}, "space"),
    ("space.lr", {"type": "float", "low": 1, "high": 0.1}, "space.lr"), ("space.lr.low", float("nan"), "space.lr"),
    ("space.lr.high", float("inf"), "space.lr"), ("space.lr", {"type": "float", "low": 0, "high": 1, "log": True}, "space.lr"),
    ("space.nonsense_field", {"type": "int", "low": 1, "high": 3}, "nonsense_field"),
    ("budget.usd", -5, "budget.usd"), ("budget.usd", float("inf"), "budget.usd"), ("budget.wall_time", "soon", "budget.wall_time"),
    ("base", "../absent.yaml", "absent.yaml"), ("name", "Bad Name", "name"), ("seed", "lucky", "seed"),
    ("pruner.type", "oracle", "pruner"),
]


@pytest.mark.parametrize("field,value,names", BAD_SWEEPS, ids=[f"{f}={str(v)[:16]}" for f, v, _ in BAD_SWEEPS])
def test_a_bad_sweep_spec_is_refused_with_nothing_created(tmp_path, field, value, names):
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (tmp_path / "sweep-base.yaml").write_text((REPO / "examples" / "sweep-base.yaml").read_text())
    path = sweeps / "sweep.yaml"
    path.write_text(yaml.safe_dump(with_path(SWEEP, field, value), sort_keys=False))
    home = tmp_path / "home"
    assert_refused(cli(home, "sweep", str(path)), names)
    assert not home.exists()


BAD_STACKS = {
    "a missing stack": (None, "no such stack file"),
    "a stack file not named Pulumi.<env>.yaml": ("stack.yaml", "Pulumi.<env>.yaml"),
    "an aliased stack file": ("alias", "alias"),
    "a stack that is a list": ("list", "mapping"),
}


@pytest.mark.parametrize("case", BAD_STACKS)
def test_a_bad_stack_file_is_named(tmp_path, case):
    kind, names = BAD_STACKS[case]
    home = tmp_path / "home"
    job = spec_file(tmp_path, QUICKSTART)
    if kind is None:
        stack = tmp_path / "Pulumi.absent.yaml"
    elif kind == "stack.yaml":
        stack = tmp_path / "stack.yaml"
        stack.write_text(Path(DEV).read_text())
    elif kind == "alias":
        stack = tmp_path / "Pulumi.dev.yaml"
        stack.write_text("config: &c {}\nother: *c\n")
    else:
        stack = tmp_path / "Pulumi.dev.yaml"
        stack.write_text("- config\n")
    assert_refused(cli(home, "check", str(job), "--stack", str(stack)), names)
    assert not home.exists()


# ---- what a previous run left behind -----------------------------------------------------------------------------

def recorded_job(home: Path, name: str, state: dict | str) -> Path:
    directory = home / "jobs" / name
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    (directory / "spec.yaml").write_text(yaml.safe_dump({**QUICKSTART, "name": name}))
    (directory / "checkpoints").mkdir()
    (directory / "checkpoints" / "keep-me").write_text("a checkpoint")
    return directory


DAMAGED_STATES = {"not JSON": "{bad", "a list": "[]", "an unknown field": json.dumps({"name": "old", "team": "vision", "colour": 1}),
                  "another job's record": json.dumps({"name": "someone-else", "team": "vision"}), "empty": ""}


@pytest.mark.parametrize("damage", DAMAGED_STATES)
def test_one_damaged_job_record_is_named_and_does_not_break_the_others(tmp_path, damage):
    home = tmp_path / "home"
    recorded_job(home, "old", DAMAGED_STATES[damage])
    recorded_job(home, "fine", {"name": "fine", "team": "vision", "state": "succeeded", "created_at": 1.0})
    before = fingerprint(home)
    assert_refused(cli(home, "status", "old"), "state.json", exit_code=1)
    assert cli(home, "status", "fine").returncode == 0
    listed = cli(home, "list", "-o", "json")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    states = {row["name"]: row["state"] for row in json.loads(listed.stdout)}
    assert states == {"old": "damaged", "fine": "succeeded"}
    spec = spec_file(tmp_path, {**QUICKSTART, "name": "old"})
    assert_refused(cli(home, "submit", "--detach", str(spec)), "state.json", exit_code=1)
    assert_refused(cli(home, "check", str(spec), "--stack", DEV), "state.json", exit_code=1)  # spend unknown: no guess
    assert fingerprint(home) == before, "a refused command changed what was there"


@pytest.mark.parametrize("started", ["1", None], ids=["another start time", "no start time recorded"])
def test_a_reused_pid_is_never_signalled(tmp_path, started):
    """A record naming a live process that is not its supervisor (PID reuse) reads as lost; cancel signals nothing.
    A record without the supervisor's start time cannot prove the PID is still its own, so it is not trusted either."""
    home = tmp_path / "home"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        recorded_job(home, "old", {"name": "old", "team": "vision", "state": "running", "supervisor_pid": bystander.pid,
                                   "supervisor_started": started, "created_at": 1.0})
        status = json.loads(cli(home, "status", "old", "-o", "json").stdout)
        assert status["state"] == "lost"
        assert_refused_cancel = cli(home, "cancel", "old")
        assert assert_refused_cancel.returncode == 1 and "nothing to cancel" in assert_refused_cancel.stderr
        assert bystander.poll() is None, "cancel signalled a process that was not the job's"
    finally:
        bystander.kill()
        bystander.wait()


def test_resubmitting_a_name_with_another_model_is_refused_and_the_record_kept(tmp_path):
    home = tmp_path / "home"
    directory = recorded_job(home, "old", {"name": "old", "team": "vision", "state": "succeeded", "created_at": 1.0})
    before = fingerprint(home)
    spec = spec_file(tmp_path, {**QUICKSTART, "name": "old", "entry": {"task": "classifier"}})
    message = assert_refused(cli(home, "submit", "--detach", str(spec)), "entry")
    assert "another name" in message
    assert fingerprint(home) == before
    assert (directory / "checkpoints" / "keep-me").read_text() == "a checkpoint"


def test_a_home_that_cannot_be_written_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    spec = spec_file(tmp_path, QUICKSTART)
    assert_refused(cli(blocker / "home", "submit", "--detach", str(spec)), "TRAINFORGE_HOME")
    assert blocker.read_text() == "not a directory"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system for TRAINFORGE_HOME (tmpfs: root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip() or 'not root'}): the full-disk case needs one")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_disk_that_fills_up_mid_job_fails_it_with_the_reason_and_never_leaves_it_running(tmp_path, small_disk):
    """The first checkpoint fills the disk: the job ends `failed`, its record says the disk is full and what to do,
    no traceback; the record was written although nothing else could be (the job's reserve)."""
    home = small_disk / "home"
    spec = spec_file(tmp_path, {**QUICKSTART, "checkpoint": {"interval_steps": 10, "keep_last": 2},
                                "hyperparameters": {**QUICKSTART["hyperparameters"], "max_steps": 200}})
    result = cli(home, "submit", str(spec))
    assert result.returncode != 0 and "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    assert "disk holding" in result.stdout and "larger disk" in result.stdout, result.stdout[-2000:]
    state = json.loads((home / "jobs" / QUICKSTART["name"] / "state.json").read_text())
    assert state["state"] == "failed" and "is full" in state["reason"] and "TRAINFORGE_HOME" in state["reason"]
    listed = cli(home, "list")
    assert listed.returncode == 0 and "failed" in listed.stdout and "running" not in listed.stdout


def test_a_disk_with_room_for_the_record_but_not_its_reserve_refuses_the_submit_and_leaves_nothing_pending(tmp_path, small_disk):
    """The spec and the record fit, the job's reserve does not: the submit is refused and what it wrote is gone (it
    used to leave the record `pending` for ever, no supervisor to run it, the name taken)."""
    import shutil
    room = 64 * 1024
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'filler'}", "bs=4k",
                    f"count={(shutil.disk_usage(small_disk).free - room) // 4096}"], capture_output=True, check=True)
    spec = spec_file(tmp_path, QUICKSTART)
    message = assert_refused(cli(small_disk / "home", "submit", "--detach", str(spec)), "TRAINFORGE_HOME")
    assert "No space left on device" in message and "larger disk" in message
    assert not (small_disk / "home" / "jobs" / QUICKSTART["name"]).exists()
    listed = cli(small_disk / "home", "list")
    assert listed.returncode == 0 and QUICKSTART["name"] not in listed.stdout, listed.stdout


def test_a_disk_too_full_to_hold_the_jobs_record_refuses_the_submit(tmp_path, small_disk):
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until the disk is full
    spec = spec_file(tmp_path, QUICKSTART)
    message = assert_refused(cli(small_disk / "home", "submit", "--detach", str(spec)), "TRAINFORGE_HOME")
    assert "No space left on device" in message and "larger disk" in message
    # Nothing half-written: no record left `pending` for ever (issue 37), the job's name free for the next submit.
    state = small_disk / "home" / "jobs" / QUICKSTART["name"] / "state.json"
    assert not state.exists() or json.loads(state.read_text())["state"] != "pending", state.read_text()
    listed = cli(small_disk / "home", "list")
    assert listed.returncode == 0 and "pending" not in listed.stdout, listed.stdout



# ---- hostile files and directories (issue 37): refused, no hang, nothing written outside TRAINFORGE_HOME -------------

def test_a_spec_that_is_a_device_or_a_fifo_is_refused_without_hanging(tmp_path):
    import os
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, kind in ((zero, "a device"), (fifo, "a FIFO")):
        for command in (("check", str(path), "--stack", DEV), ("render", str(path)), ("submit", str(path))):
            message = assert_refused(cli(tmp_path / "home", *command), kind)
            assert "not a regular file" in message
    assert not (tmp_path / "home").exists()


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    text = (REPO / "examples" / "quickstart.yaml").read_text() + "\nname: second-name\n"
    path = tmp_path / "job.yaml"
    path.write_text(text)
    message = assert_refused(cli(tmp_path / "home", "render", str(path)), "given twice")
    assert "'name'" in message


def test_twenty_thousand_unknown_keys_print_twenty_problems(tmp_path):
    document = {**QUICKSTART, **{f"unknown_{i}": i for i in range(20_000)}}
    message = assert_refused(cli(tmp_path / "home", "render", str(spec_file(tmp_path, document))), "unknown_0")
    assert message.count("\n  - ") <= 21 and "more problems" in message


def _submitted(tmp_path):
    home = tmp_path / "home"
    spec = spec_file(tmp_path, {**QUICKSTART, "name": "planted"})
    return home, spec, home / "jobs" / "planted"


@pytest.mark.parametrize("entry", ["", "checkpoints", "run", "job.log"])
def test_a_symlink_in_a_jobs_directory_is_refused_and_nothing_is_written_through_it(tmp_path, entry):
    home, spec, job = _submitted(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "step-00000010").mkdir()  # what rank 0 would delete there
    (elsewhere / "secret.txt").write_text("another user's file")
    if entry:
        job.mkdir(parents=True)
        (job / entry).symlink_to(elsewhere / ("secret.txt" if entry == "job.log" else ""))
    else:
        job.parent.mkdir(parents=True)
        job.symlink_to(elsewhere)
    for command in (("submit", str(spec)), ("status", "planted"), ("logs", "planted"), ("cancel", "planted")):
        result = cli(home, *command)
        assert result.returncode == 2 and "is a symbolic link" in result.stderr and "Fix" in result.stderr, (command, result.stderr[-2000:])
        assert "another user's file" not in result.stdout
    assert sorted(p.name for p in elsewhere.iterdir()) == ["secret.txt", "step-00000010"], "nothing written or deleted there"



@pytest.mark.parametrize("content", ["not: [valid", "prices: 5", "region: us-east-1\nas_of: x\nsource: y\non_demand: {p5.48xlarge: -3}",
                                     "region: us-east-1\nas_of: x\nsource: y\nspot: {g6.xlarge: cheap}", "\x00\xff"],
                         ids=["not YAML", "another document", "a negative price", "a price that is no number", "binary"])
def test_a_damaged_refreshed_price_file_is_refused_with_the_file_and_the_fix(tmp_path, content):
    home = tmp_path / "home"
    prices = home / "prices" / "us-east-1.yaml"
    prices.parent.mkdir(parents=True)
    prices.write_bytes(content.encode("latin-1"))
    for command in (("prices", "show"), ("check", str(REPO / "examples" / "quickstart.yaml"), "--stack", DEV)):
        message = assert_refused(cli(home, *command), "prices/us-east-1.yaml")
        assert "trainforge prices refresh" in message
