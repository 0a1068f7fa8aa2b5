"""Checkpoint checksums hashed by the rank that wrote each file (issue 38, item 7), folded into one manifest by rank 0,
and the ranks agreeing on a save (a peer gone before its checksums, the emergency save decided once for all);
the resume check hashes files in parallel. Real files, real SHA-256, real gloo ranks; the two-rank training runs are in
tests/test_runtime.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest

from trainforge import exits
from trainforge.trainer.runtime import checkpoint_files as files

WRITTEN = ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp", "__10_0.distcp", ".metadata", "trainer.pt",
           "rng-rank0.pt", "rng-rank1.pt", "rng-rank10.pt"]


def checkpoint(tmp_path, names=WRITTEN):
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(f"{name}:{i}".encode() * 1000)
    return tmp_path


def test_every_file_is_hashed_by_exactly_one_rank_the_one_that_wrote_it(tmp_path):
    directory = checkpoint(tmp_path)
    owned = {rank: {f.name for f in files.own_files(directory, rank, 11)} for rank in range(11)}
    assert owned[1] == {"__1_0.distcp", "__1_1.distcp", "rng-rank1.pt"}
    assert owned[10] == {"__10_0.distcp", "rng-rank10.pt"}, "rank 10's files are not rank 1's"
    assert owned[0] == {"__0_0.distcp", "__0_1.distcp", ".metadata", "trainer.pt", "rng-rank0.pt"}
    claimed = [name for names in owned.values() for name in names]
    assert sorted(claimed) == sorted(WRITTEN), "each file once"


def test_ranks_hash_their_own_and_rank_0_folds_them_into_the_checksums_one_pass_gives(tmp_path):
    directory = checkpoint(tmp_path)
    expected = {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in WRITTEN}
    others = [threading.Thread(target=files.write_rank_digests, args=(directory, rank, 11)) for rank in range(1, 11)]
    for t in others:
        t.start()
    files.write_rank_digests(directory, 0, 11)
    merged = files.gather_digests(directory, 11, timeout_s=60)
    for t in others:
        t.join()
    assert merged == expected == files.file_digests(directory)
    assert not list(directory.glob(f"{files.RANK_DIGESTS}*")), "the per-rank files are folded in and removed"
    committed = files.write_manifest(directory, 7, None, 11, merged)
    manifest = json.loads((directory / files.COMMIT_MARKER).read_text())
    assert set(manifest["files"]) == set(WRITTEN) and committed.step == 7
    assert files.content_problem(directory) is None
    (directory / "__1_1.distcp").write_bytes(b"x" * (directory / "__1_1.distcp").stat().st_size)
    assert files.content_problem(directory) == "__1_1.distcp does not match its checksum (same size, other content)"


def test_a_rank_that_never_reports_leaves_the_checkpoint_uncommitted_and_the_attempt_retried(tmp_path):
    """A rank that has not hashed its own files within the patience is gone (its node vanished): the attempt is
    retried from the last checkpoint. It used to be a TimeoutError, which the worker's exit took for the job's own
    bug (exit 1): never retried."""
    from trainforge.trainer.runtime.__main__ import exit_code_for
    directory = checkpoint(tmp_path)
    files.write_rank_digests(directory, 0, 2)
    with pytest.raises(files.PeerLost, match=r"no checksums from \['.sha256-rank1.json'\]") as gone:
        files.gather_digests(directory, 2, timeout_s=0.3)
    assert exit_code_for(gone.value) == exits.EXIT_PEER_LOST
    assert not (directory / files.COMMIT_MARKER).exists()


def test_a_failing_run_stops_waiting_for_the_checksums_of_a_peer_that_is_gone(tmp_path):
    """A SIGKILLed peer never writes its checksums. Rank 0's checksum thread waited up to ten minutes for them, and the
    failing process's exit joins that thread: the survivor hung until torchrun's SIGKILL 30 s later (seen in about one
    run in eight of test_runtime's SIGKILL test). Abandoned, the wait ends at once and commits nothing."""
    directory = checkpoint(tmp_path)
    files.write_rank_digests(directory, 0, 2)
    abandoned, outcome = threading.Event(), []

    def gather():
        try:
            files.gather_digests(directory, 2, timeout_s=600, abandoned=abandoned)
        except files.SaveAbandoned as exc:
            outcome.append(exc)
    waiting = threading.Thread(target=gather)
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive(), "rank 1's checksums are missing: it waits"
    abandoned.set()
    waiting.join(timeout=5)
    assert not waiting.is_alive() and len(outcome) == 1 and "not committed" in str(outcome[0])
    assert not (directory / files.COMMIT_MARKER).exists()


# Two real ranks on gloo saving one checkpoint, each a process of its own; rank 1 may die right where it would write its
# checksums (after DCP's save, which every rank finished together).
TWO_RANK_SAVE = """
import dataclasses, os, sys
import torch, torch.distributed as dist
from trainforge.trainer.runtime import checkpoint
from trainforge.trainer.runtime.__main__ import exit_code_for
from trainforge.trainer.runtime.config import CheckpointConfig
rank, directory, rank1_dies = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "dies"
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(directory, "store"), 2), rank=rank, world_size=2)
manager = checkpoint.CheckpointManager(CheckpointConfig(dir=os.path.join(directory, "ckpt"), async_save=False), rank=rank,
                                       world_size=2, metric_mode="min", process_group=dist.new_group(backend="gloo"))
if rank == 1 and rank1_dies:
    checkpoint.write_rank_digests = lambda *args: os._exit(9)  # killed the moment its save's writes are done
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.AdamW(model.parameters())
try:
    manager.save(1, model, optimizer, {"step": 1}, None, blocking=True)
    print("committed", flush=True)
    if sys.argv[3] == "damaged-share":  # step 2 saved, then a file only rank 1 checks is damaged in place
        manager.save(2, model, optimizer, {"step": 2}, None, blocking=True)
        step2 = os.path.join(directory, "ckpt", "step-00000002")
        if rank == 0:
            import json
            manifest = json.load(open(os.path.join(step2, "COMMITTED")))
            from trainforge.trainer.runtime.checkpoint_files import share_of
            victim = share_of(manifest["files"], 1, 2)[0]
            size = os.path.getsize(os.path.join(step2, victim))
            open(os.path.join(step2, victim), "r+b").write(b"x" * size)
            print(f"damaged {victim}", flush=True)
        dist.barrier()
        import hashlib, json
        read, file_digest = [], hashlib.file_digest  # which files this rank reads to hash them (the stdlib's call)
        hashlib.file_digest = lambda stream, name: read.append(os.path.relpath(stream.name, directory)) or file_digest(stream, name)
        print(f"latest {manager.latest().step}", flush=True)
        print(f"hashed {json.dumps(read)}", flush=True)
    if sys.argv[3] == "clocks-differ":  # preempted at step 2: skip the emergency save if the last is under a minute old
        manager.cfg = manager.cfg.model_copy(update={"emergency_skip_if_newer_than_s": 60.0})
        if rank == 1:  # its clock says the last commit is an hour old; rank 0's says it is fresh
            manager.last_commit = dataclasses.replace(manager.last_commit, committed_at=manager.last_commit.committed_at - 3600)
        manager.subject = checkpoint.Subject(model, optimizer, lambda: {})
        print(f"emergency save: {manager.emergency_save(2, None)}", flush=True)
except BaseException as exc:
    print(f"exit {exit_code_for(exc)}: {exc}", flush=True)
    os._exit(exit_code_for(exc))
os._exit(0)
"""


WRITTEN_BY_TWO_RANKS = [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-rank0.pt", "rng-rank1.pt", "trainer.pt"]


def save_on_two_ranks(tmp_path, rank1: str) -> tuple[subprocess.CompletedProcess, int]:
    done = on_two_ranks(tmp_path, rank1)
    return done[0], done[1].returncode


def on_two_ranks(tmp_path, mode: str) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "two_rank_save.py"
    script.write_text(TWO_RANK_SAVE)
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path), mode], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
        return [subprocess.CompletedProcess(rank.args, rank.returncode, out) for rank, out in zip(ranks, outputs)]
    finally:
        for rank in ranks:
            rank.kill()
            rank.communicate()


@pytest.mark.slow
def test_two_ranks_save_blocking_and_rank_0_commits_every_ranks_checksums(tmp_path):
    rank0, rank1 = save_on_two_ranks(tmp_path, "lives")
    assert (rank0.returncode, rank1) == (0, 0), rank0.stdout
    manifest = json.loads((tmp_path / "ckpt" / "step-00000001" / files.COMMIT_MARKER).read_text())
    assert {"rng-rank0.pt", "rng-rank1.pt", "trainer.pt", ".metadata"} <= set(manifest["sha256"])


@pytest.mark.slow
def test_a_peer_dying_before_its_checksums_ends_a_blocking_save_at_once_as_a_retry(tmp_path):
    """Rank 1 dies between DCP's save and writing its checksums. Rank 0 used to wait ten minutes for them on the
    training thread, then exit 1 (a user error: the job was never retried). Now the barrier after the checksums fails
    as soon as rank 1's connections reset: a retry, and nothing committed."""
    rank0, rank1 = save_on_two_ranks(tmp_path, "dies")
    assert rank1 == 9
    assert rank0.returncode == exits.EXIT_PEER_LOST, rank0.stdout
    # gloo's own words vary with the moment rank 1 went ("Rank 1 failed to pass monitoredBarrier", or the reset alone)
    assert "not every rank finished its part of the save" in rank0.stdout
    assert not (tmp_path / "ckpt" / "step-00000001" / files.COMMIT_MARKER).exists()


@pytest.mark.slow
def test_on_preemption_the_ranks_skip_or_take_the_emergency_save_together_whatever_their_clocks_say(tmp_path):
    """`emergency_skip_if_newer_than_s`: each rank's clock (and its own commit time) differs. Ranks that disagreed would
    leave the savers in the save's collectives, waiting for ranks that had already exited: rank 0 decides for all."""
    rank0, rank1 = save_on_two_ranks(tmp_path, "clocks-differ")
    assert (rank0.returncode, rank1) == (0, 0), rank0.stdout
    assert "emergency save: False" in rank0.stdout, "rank 0's clock: the last commit is fresh"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step-")) == ["step-00000001"]


def test_the_resume_check_is_shared_out_by_size_so_every_file_is_checked_once_and_the_shares_are_even():
    sizes = {"__0_0.distcp": 900, "__0_1.distcp": 880, "__1_0.distcp": 910, "__1_1.distcp": 870, ".metadata": 40,
             "trainer.pt": 10, "rng-rank0.pt": 5, "rng-rank1.pt": 5}
    for parts in (1, 2, 3, 8, 16):
        shares = [files.share_of(sizes, part, parts) for part in range(parts)]
        assert sorted(name for share in shares for name in share) == sorted(sizes), "each file once"
        loads = [sum(sizes[name] for name in share) for share in shares]
        assert max(loads) - min(loads) <= max(sizes.values()), f"{parts} parts: even up to one file: {loads}"


@pytest.mark.slow
def test_a_damaged_file_in_another_ranks_share_sends_every_rank_back_to_the_last_sound_checkpoint(tmp_path):
    """Each rank hashes its share of the newest checkpoint's files at resume; rank 1 finds the damage, and both ranks
    resume from step 1, the newest sound one (rank 0 alone hashed every file while the others waited)."""
    rank0, rank1 = on_two_ranks(tmp_path, "damaged-share")
    assert (rank0.returncode, rank1.returncode) == (0, 0), rank0.stdout + rank1.stdout
    victim = next(line.split()[1] for line in rank0.stdout.splitlines() if line.startswith("damaged "))
    assert "latest 1" in rank0.stdout and "latest 1" in rank1.stdout
    assert f"{victim} does not match its checksum" in rank0.stdout, "rank 0 says which file, found by rank 1"
    assert not (tmp_path / "ckpt" / "step-00000002").exists(), "the damaged checkpoint is removed"
    hashed = [json.loads(next(line for line in r.stdout.splitlines() if line.startswith("hashed "))[7:]) for r in (rank0, rank1)]
    for step in ("step-00000002", "step-00000001"):
        mine, theirs = ({name for name in read if name.startswith(f"ckpt/{step}/")} for read in hashed)
        files = {f"ckpt/{step}/{name}" for name in WRITTEN_BY_TWO_RANKS}
        assert mine | theirs == files and not mine & theirs, f"{step}: each file hashed once, by one rank: {hashed}"
        assert mine and theirs, "both ranks took a share"


def test_a_file_the_file_system_cannot_read_at_resume_keeps_the_checkpoint_and_restarts_the_job(tmp_path):
    """Not readable is not damaged: a file system's error (here a socket where a file of the same size stood, which
    open() refuses with ENXIO) must not send the job back to an older checkpoint and have the newest removed."""
    import hashlib
    import socket

    import torch.distributed as dist

    from trainforge.exits import EXIT_SERVICES_DOWN, ServicesDown
    from trainforge.trainer.runtime.__main__ import exit_code_for
    from trainforge.trainer.runtime.checkpoint import CheckpointManager
    from trainforge.trainer.runtime.config import CheckpointConfig
    step = tmp_path / "ckpt" / files.step_dir_name(3)
    step.mkdir(parents=True)
    (step / "empty.bin").write_bytes(b"")
    files.write_manifest(step, 3, None, 1, {"empty.bin": hashlib.sha256(b"").hexdigest()})
    (step / "empty.bin").unlink()
    with socket.socket(socket.AF_UNIX) as unreadable:
        here = os.getcwd()
        os.chdir(step)  # a socket's path must fit in 108 bytes: bound by its name, whatever the temp directory's depth
        try:
            unreadable.bind("empty.bin")
        finally:
            os.chdir(here)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt")), rank=0, world_size=1, metric_mode="min",
                                        process_group=dist.new_group(backend="gloo"))
            with pytest.raises(ServicesDown, match="empty.bin") as down:
                manager.latest()
        finally:
            dist.destroy_process_group()
    assert exit_code_for(down.value) == EXIT_SERVICES_DOWN
    assert (step / files.COMMIT_MARKER).exists(), "the checkpoint is kept"
