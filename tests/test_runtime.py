"""The runtime, for real on CPU: torchrun with gloo, real checkpoints on disk, real signals."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")

from support.lanes import ITSELF, TRAINING, full  # noqa: E402
from support.servers import free_port  # noqa: E402
from support.training import BASE, result, run, start, wait_for_step  # noqa: E402

from trainforge import exits, paths  # noqa: E402
from trainforge.trainer.launch import EXIT_WORKER_LOST  # noqa: E402

pytestmark = [pytest.mark.slow, TRAINING]


def losses(workdir: Path) -> dict[int, float]:
    out = {}
    for line in (workdir / "run" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out[record["step"]] = record["loss"]  # a replayed step overwrites: the trajectory as finally trained
    return out


def final_params(workdir: Path) -> dict:
    return torch.load(workdir / "run" / "final_model.pt", weights_only=True)


def assert_bit_identical(a: Path, b: Path) -> None:
    pa, pb = final_params(a), final_params(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), f"{name} differs"
    # The loss is logged every log_every steps (and at the step a preempted run stopped): every step the reference
    # logged, the interrupted-and-resumed run logged too, with the same loss to the bit.
    la, lb = losses(a), losses(b)
    assert la and set(la) <= set(lb)
    assert {step: lb[step] for step in la} == la


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted 2-rank runs, one per strategy, that the interrupted ones must match bit for bit."""
    cache = {}

    def get(strategy: str) -> Path:
        if strategy not in cache:
            workdir = tmp_path_factory.mktemp(f"reference-{strategy}")
            run(workdir, f"strategy={strategy}")
            cache[strategy] = workdir
        return cache[strategy]
    return get


@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=full("the other strategy; both train in the SIGKILL tests", kept_by=ITSELF)), "fsdp"])
def test_two_ranks_train_the_classifier_to_target(tmp_path, strategy):
    """2-process torchrun, DDP and FSDP2: the bundled classifier reaches 90 % eval accuracy."""
    run(tmp_path, f"strategy={strategy}", "max_steps=300", "target_metric=0.9", "eval_every=25")
    outcome = result(tmp_path)
    assert outcome["stopped_because"] == "target_metric" and outcome["last_eval"]["accuracy"] >= 0.9


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigkill_mid_run_then_restart_is_bit_identical(tmp_path, reference, strategy):
    job = start(tmp_path, f"strategy={strategy}", "step_sleep_s=0.05")
    wait_for_step(tmp_path, 25)
    rank1 = int((tmp_path / "run" / "pids" / "rank1.pid").read_text())
    os.kill(rank1, signal.SIGKILL)
    job.wait(timeout=120)
    assert job.returncode != 0
    run(tmp_path, f"strategy={strategy}")  # a fresh rendezvous, as the supervisor does
    assert result(tmp_path)["resumed_from"] in (20, 30)
    assert_bit_identical(reference(strategy), tmp_path)


def test_sigterm_commits_an_emergency_checkpoint_and_resume_is_bit_identical(tmp_path, reference):
    job = start(tmp_path, "strategy=ddp", "step_sleep_s=0.05")
    wait_for_step(tmp_path, 25)
    job.send_signal(signal.SIGTERM)  # torchrun forwards it to every worker, as a pod eviction would
    job.wait(timeout=120)
    preempted = json.loads((tmp_path / "run" / "preempted.json").read_text())
    assert preempted["emergency_checkpoint"] is True
    step_dir = tmp_path / "checkpoints" / f"step-{preempted['step']:08d}"
    assert (step_dir / "COMMITTED").exists(), "emergency checkpoint not committed"
    print(f"SIGTERM -> committed emergency checkpoint: {preempted['sigterm_to_commit_s']:.3f} s")
    run(tmp_path, "strategy=ddp")
    assert result(tmp_path)["resumed_from"] == preempted["step"]
    assert_bit_identical(reference("ddp"), tmp_path)


def test_sigterm_exit_code_means_resume_me(tmp_path):
    job = start(tmp_path, "step_sleep_s=0.05", "max_steps=1000", nproc=None)
    wait_for_step(tmp_path, 5)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == exits.EXIT_PREEMPTED


@pytest.fixture(scope="module")
def trained_30_steps(tmp_path_factory) -> Path:
    """One single-process run to step 30 (checkpoints at 10, 20, 30), trained once for the tests that damage, plant or
    resume a copy of it."""
    workdir = tmp_path_factory.mktemp("trained-30")
    run(workdir, "max_steps=30", nproc=None)
    return workdir


def copy_of(trained: Path, tmp_path: Path) -> Path:
    workdir = tmp_path / "job"
    shutil.copytree(trained, workdir)
    return workdir


DAMAGE_SEEN = {"truncate": "damaged: __0_0.distcp is", "uncommit": "no commit marker",
               "same-size": "damaged: __0_0.distcp does not match its checksum"}


@pytest.mark.parametrize("damage", DAMAGE_SEEN)
def test_damaged_newest_checkpoint_is_skipped_with_a_warning(trained_30_steps, tmp_path, damage):
    tmp_path = copy_of(trained_30_steps, tmp_path)
    newest = tmp_path / "checkpoints" / "step-00000030"
    shard = newest / "__0_0.distcp"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "same-size":  # bytes in the middle of the tensors flipped: the size still matches the manifest
        data = bytearray(shard.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
        shard.write_bytes(bytes(data))
    else:
        (newest / "COMMITTED").unlink()
    resumed = run(tmp_path, "max_steps=40", nproc=None)
    assert "ignoring checkpoint checkpoints/step-00000030" in resumed.stderr
    assert DAMAGE_SEEN[damage] in resumed.stderr
    assert "falling back to step 20" in resumed.stderr
    assert result(tmp_path)["resumed_from"] == 20
    assert (tmp_path / "checkpoints" / "step-00000040" / "COMMITTED").exists()


def test_fsdp_never_holds_the_whole_model_on_a_rank(tmp_path):
    """Issue 38: FSDP2 builds on the meta device, shards, then materialises and initialises module by module, so each
    of two ranks peaks near half the model plus one module, where building it whole (as before) held all of it."""
    width, depth = 4096, 8  # 7 hidden 4096x4096 layers: about 450 MiB of fp32 parameters; one module is 64 MiB
    run(tmp_path, "strategy=fsdp", "task=classifier", f"task_args.width={width}", f"task_args.depth={depth}", "max_steps=1",
        "warmup_steps=0", "eval_batches=1", "batch_size=8", "checkpoint.export_final=false")
    assert not (tmp_path / "run" / paths.FINAL_MODEL_FILE).exists(), "told not to: 450 MB this test does not need"
    for rank in (0, 1):
        memory = json.loads((tmp_path / "run" / f"host-memory-rank{rank}.json").read_text())
        assert memory["materialised"] == "meta" and memory["model_mb"] > 400, memory
        grew = memory["peak_mb"] - memory["before_mb"]
        assert grew < memory["model_mb"] / 2 + 128, f"rank {rank} grew {grew:.0f} MiB building a {memory['model_mb']:.0f} MiB model"


def test_a_two_rank_fsdp_checkpoint_resumes_on_one_rank(tmp_path):
    run(tmp_path, "strategy=fsdp", "max_steps=20", "warmup_steps=5")
    # Each rank hashed the files it wrote; rank 0 folded them into one manifest of every file (issue 38, item 7).
    for step in (10, 20):
        directory = tmp_path / "checkpoints" / f"step-{step:08d}"
        manifest = json.loads((directory / "COMMITTED").read_text())
        on_disk = {f.name for f in directory.iterdir() if f.name != "COMMITTED"}
        assert set(manifest["sha256"]) == set(manifest["files"]) == on_disk and {"__1_0.distcp", "rng-rank1.pt"} <= on_disk
        assert manifest["sha256"]["__1_0.distcp"] == hashlib.sha256((directory / "__1_0.distcp").read_bytes()).hexdigest()
    run(tmp_path, "strategy=fsdp", "max_steps=30", "warmup_steps=5", nproc=None)
    outcome = result(tmp_path)
    assert outcome["resumed_from"] == 20 and outcome["step"] == 30


def test_user_errors_exit_with_the_non_retryable_code(tmp_path):
    bad_precision = run(tmp_path, "precision=fp16", nproc=None, check=False)
    assert bad_precision.returncode == exits.EXIT_USER_ERROR and "fp16 needs a CUDA device" in bad_precision.stderr
    bad_field = run(tmp_path, "max_stepz=5", nproc=None, check=False)
    assert bad_field.returncode == exits.EXIT_USER_ERROR
    assert "max_stepz: Extra inputs are not permitted (got 5)" in bad_field.stderr
    bad_metric = run(tmp_path, "task=char_lm", "metric=accuracy", nproc=None, check=False)
    assert bad_metric.returncode == exits.EXIT_USER_ERROR
    assert "task 'char_lm' reports ['loss', 'perplexity'], not 'accuracy'" in bad_metric.stderr
    assert "Traceback" not in bad_field.stderr + bad_precision.stderr + bad_metric.stderr


def test_the_language_model_learns_in_the_precision_auto_picks(tmp_path):
    """The bundled transformer LM, 2 ranks, precision auto (bf16 autocast where this CPU computes bf16 natively, fp32
    where it would emulate it: tests/test_precision.py): eval loss well below the uniform-guess loss."""
    # 50 steps: at 40, eval loss 2.82 against the bound's 3.18 in fp32 on this machine (90 steps reached 2.72 in twice
    # the time); ten more leave room for a CPU where auto picks bf16
    run(tmp_path, "task=char_lm", "precision=auto", "max_steps=50", "eval_every=50", "eval_batches=8", "lr=0.003")
    outcome = result(tmp_path)
    assert outcome["precision"] in ("bf16", "fp32") and outcome["precision_reason"].startswith("auto: ")
    assert outcome["deterministic"] is True and outcome["deterministic_reason"].startswith("auto: on on cpu"), "issue 38: what the device honours"
    import math
    uniform = math.log(95)  # printable ASCII vocabulary
    assert outcome["last_eval"]["loss"] < 0.7 * uniform, outcome


OWN_TASK = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainforge.trainer.runtime import Task

def build(noise: float = 0.01) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + noise * torch.randn(2048, 1, generator=g)
    def loss(model, batch):
        xb, yb = batch
        return nn.functional.mse_loss(model(xb), yb), {"samples": len(xb)}
    def sums(model, batch):
        xb, yb = batch
        return {"se": ((model(xb) - yb) ** 2).sum(), "n": torch.tensor(float(len(xb)))}
    return Task(name="regression", build_model=lambda: nn.Linear(4, 1), train_set=TensorDataset(x[:1792], y[:1792]),
                eval_set=TensorDataset(x[1792:], y[1792:]), loss=loss, eval_sums=sums,
                summarize=lambda s: {"mse": s["se"] / s["n"]}, metrics=("mse",), default_metric=("mse", "min"))
'''


def test_a_researchers_own_model_and_data_run_through_module_factory(tmp_path, monkeypatch):
    (tmp_path / "my_research.py").write_text(OWN_TASK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run(tmp_path / "work", "task=my_research:build", "task_args.noise=0.02", "max_steps=200", "eval_every=100", "lr=0.05")
    assert result(tmp_path / "work")["last_eval"]["mse"] < 0.01


def test_an_unloadable_task_is_a_user_error(tmp_path):
    outcome = run(tmp_path, "task=no_such_module:build", nproc=None, check=False)
    assert outcome.returncode == exits.EXIT_USER_ERROR and "cannot load task factory 'no_such_module:build'" in outcome.stderr


def descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(c) for c in children.read_text().split()] if children.exists() else []
    return [k for kid in kids for k in (kid, *descendants(kid))]


def test_a_lost_node_makes_the_survivors_retry_not_fail(tmp_path):
    """Two nodes on loopback, each under the node launcher as on the cluster. Node 1's worker is SIGKILLed: node 0's
    worker then fails in a collective, which is not its own bug. Exit 1 would fail the job for good under
    PyTorchJob's ExitCode policy; both nodes must exit with a retryable code instead."""
    port = free_port()
    sets = [a for o in [*BASE, "max_steps=100000", "step_sleep_s=0.05"] for a in ("--set", o)]

    def node(rank: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "trainforge.trainer.launch", "--nproc-per-node=1", f"--exit-dir={tmp_path}/exit{rank}",
                                 "--", "--nnodes=2", f"--node-rank={rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                                 "--rdzv-id=lost-node", "-m", "trainforge.trainer.runtime", *sets],
                                cwd=tmp_path, stdout=open(tmp_path / f"node{rank}.log", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def worker_of(node_rank: int) -> int:
        """That node's worker: the one its log says was forked through its rank proxy, else its launcher's
        descendant (cold: launcher -> torchrun -> `python -u -m trainforge.trainer.runtime`). Rendezvous, not the
        node's rank, decides the worker's rank, so the ranks' pid files cannot tell."""
        said = [line.split()[2] for line in (tmp_path / f"node{node_rank}.log").read_text().splitlines()
                if line.startswith("trainforge: worker ") and "forked" in line]
        if said:
            return int(said[0])
        return next(p for p in descendants(nodes[node_rank].pid)
                    if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[1:4] == [b"-u", b"-m", b"trainforge.trainer.runtime"])

    nodes = [node(0), node(1)]
    try:
        wait_for_step(tmp_path, 5)
        os.kill(worker_of(1), signal.SIGKILL)
        codes = [n.wait(timeout=90) for n in nodes]
    finally:
        # The whole tree: each launcher's process group (its torchrun, when cold) and each worker's (its own session,
        # cold or forked); a killed agent would leave its worker training on.
        workers = [int(p.read_text()) for p in (tmp_path / "run" / paths.PIDS_DIR).glob("*.pid")]
        for group in [n.pid for n in nodes] + workers:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert codes[1] == EXIT_WORKER_LOST, "the node whose worker vanished"
    assert [p.read_text() for p in (tmp_path / "exit0").glob("rank*.code")] == [str(exits.EXIT_PEER_LOST)], \
        (tmp_path / "node0.log").read_text()[-2000:]
    assert exits.is_retryable(codes[0]), f"the surviving node exited {codes[0]}: the job would fail instead of resuming"


class _Payload:
    """A pickle that runs a shell command when loaded: what someone who could write a job's directory would plant."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("planted", ["trainer.pt", "rng-rank0.pt", ".metadata"])
def test_a_checkpoint_that_would_run_code_is_refused_not_executed(trained_30_steps, tmp_path, planted):
    import pickle

    import torch
    tmp_path = copy_of(trained_30_steps, tmp_path)
    newest = tmp_path / "checkpoints" / "step-00000030"
    marker = tmp_path / "pwned"
    target = newest / planted
    if planted == ".metadata":
        target.write_bytes(pickle.dumps(_Payload(marker)))
    else:
        torch.save({"state": _Payload(marker)}, target)
    # Whoever planted it also fixes the manifest, so neither the size nor the checksum check can save the job.
    manifest = json.loads((newest / "COMMITTED").read_text())
    manifest["files"][planted] = target.stat().st_size
    manifest["sha256"][planted] = hashlib.sha256(target.read_bytes()).hexdigest()
    (newest / "COMMITTED").write_text(json.dumps(manifest))
    resumed = run(tmp_path, "max_steps=40", nproc=None, check=False)
    assert not marker.exists(), "the planted pickle ran"
    assert resumed.returncode == exits.EXIT_USER_ERROR, resumed.stderr[-2000:]
    assert f"step-00000030/{planted}" in resumed.stderr and "not loaded" in resumed.stderr
    assert "remove its directory to resume from" in resumed.stderr
    assert "Traceback" not in resumed.stderr


def plant_in_optimizer_state(checkpoint: Path, marker: Path) -> None:
    """Rewrite a checkpoint's shards with DCP itself, the payload in the optimizer's `param_groups` (a non-tensor value,
    which DCP's default planner unpickles with weights_only=False), and fix the manifest to match."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    whole = checkpoint.parent / "whole.pt"
    dcp_to_torch_save(checkpoint, whole)  # the honest checkpoint, read as the attacker would
    state = torch.load(whole, weights_only=False)
    whole.unlink()
    state["optim"]["param_groups"][0]["lr"] = _Payload(marker)
    for shard in [*checkpoint.glob("*.distcp"), checkpoint / ".metadata"]:
        shard.unlink()
    dcp.save(state, checkpoint_id=str(checkpoint), no_dist=True)  # pickles the payload; nothing runs
    assert not marker.exists()
    manifest = json.loads((checkpoint / "COMMITTED").read_text())
    files = [f for f in checkpoint.iterdir() if f.name != "COMMITTED"]
    manifest["files"] = {f.name: f.stat().st_size for f in files}
    manifest["sha256"] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    (checkpoint / "COMMITTED").write_text(json.dumps(manifest))


@pytest.mark.parametrize("how", ["resume", "start_from"])
def test_a_payload_in_the_optimizer_state_never_runs(trained_30_steps, tmp_path, how):
    """Issue 37: the shards' non-tensor values are read as data only, on resume and when another job starts from the
    checkpoint (a promoted sweep trial): the job fails as a user error naming the checkpoint and the value."""
    source = copy_of(trained_30_steps, tmp_path)
    newest = source / "checkpoints" / "step-00000030"
    marker = tmp_path / "pwned"
    plant_in_optimizer_state(newest, marker)
    if how == "resume":
        done = run(source, "max_steps=40", nproc=None, check=False)
    else:
        job = tmp_path / "promoted"
        job.mkdir()
        done = run(job, "max_steps=40", f"checkpoint.start_from={source / 'checkpoints'}", nproc=None, check=False)
    assert not marker.exists(), "the planted pickle ran"
    assert done.returncode == exits.EXIT_USER_ERROR, done.stderr[-3000:]
    assert "step-00000030" in done.stderr and "'optim.param_groups" in done.stderr and "not loaded" in done.stderr, done.stderr[-2000:]
    assert "GLOBAL posix.system" in done.stderr, "the refusal names what the value asked to run"
    assert "Traceback" not in done.stderr


def test_a_checkpoint_written_now_resumes_with_data_only_loading(trained_30_steps, tmp_path):
    """Every file a save writes loads under the data-only rules (a save that wrote an object would fail here)."""
    tmp_path = copy_of(trained_30_steps, tmp_path)
    run(tmp_path, "max_steps=40", nproc=None)
    assert result(tmp_path)["resumed_from"] == 30
