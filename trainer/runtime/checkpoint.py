"""The checkpointer: saves (async by default), commits, prunes and resumes with torch.distributed.checkpoint, and
decides when — every `interval_steps`, at the end, and on preemption — as torchtitan's CheckpointManager does. What a
checkpoint is on disk, and how it is read without running code: checkpoint_files.py."""

from __future__ import annotations

import datetime
import logging
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from trainforge.exits import ServicesDown
from trainforge.trainer.runtime.checkpoint_files import (DIGESTS_TIMEOUT_S, Committed, SafeLoadPlanner, SafeReader, UnsafeCheckpoint, content_problem, gather_digests,
                                                         load_data, rng_file_name, rng_state, scan, saved_world_size, set_rng_state, start_from,
                                                         step_dir_name, write_manifest, write_rank_digests)
from trainforge.trainer.runtime.config import CheckpointConfig, PeerLost, UserError
from trainforge.trainer.runtime.hooks import Stateful

log = logging.getLogger("trainforge.runtime")


@dataclass
class Subject:
    """What a checkpoint holds: the model and optimizer (sharded by DCP) and the named pieces saved beside them
    (step counters, scheduler, sampler, stateful hooks). `pieces` is called at each save and load, so a piece added
    after the checkpointer was made (an eval hook) is included."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    pieces: Callable[[], dict[str, Stateful]]

    def trainer_state(self) -> dict[str, Any]:
        return {name: piece.state_dict() for name, piece in self.pieces().items()}

    def load_trainer_state(self, saved: dict[str, Any]) -> None:
        for name, piece in self.pieces().items():
            if name in saved:  # a piece added since the checkpoint was written starts fresh
                piece.load_state_dict(saved[name])


@dataclass(frozen=True)
class Resumed:
    step: int
    path: Path
    rng_restored: bool  # False when the world size changed: each rank's generators were reseeded instead


@dataclass
class _Pending:
    step: int
    path: Path
    metric: float | None
    future: Future
    started: float


def settle_device(device: torch.device) -> None:
    """Wait until the work queued on `device`'s current stream (the step's backward and optimizer update) has run.

    An async save stages the state on its own CUDA stream, which does not wait for the compute stream (torch 2.13
    distributed/checkpoint/staging.py): without this, the copy can read parameters and Adam moments from before the
    step's update, or half of it, and a resume restores torn state silently. (A log step's `.item()` syncs too, which
    hid this while checkpoint steps were also log steps.) A no-op on the CPU, whose work is done when it returns."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class CheckpointManager:
    """Saves, commits, prunes and finds checkpoints, and decides when. Every rank calls every method; rank 0 does the
    bookkeeping. With a `subject` it owns what is saved: the loop calls `maybe_save` each step, `final_save` at the
    end, `emergency_save` on preemption and `load_latest` at start; `save`/`load` are the parts they are made of."""

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, metric_mode: str, process_group: dist.ProcessGroup,
                 subject: Subject | None = None, device: torch.device = torch.device("cpu")):
        self.cfg, self.rank, self.world_size, self.metric_mode = cfg, rank, world_size, metric_mode
        # Called right before a save reads the state: the step's queued device work must have written it (below).
        self.settle: Callable[[], None] = lambda: settle_device(device)
        self.subject = subject
        self.directory = Path(cfg.dir)
        # Checkpoint collectives run in a background thread; their own gloo group keeps them from
        # interleaving with the training loop's collectives on the default group.
        self.pg = process_group
        self._pending: _Pending | None = None
        self._staging: Future | None = None
        self._stager = None  # created on the first async save; keeps its staging buffers between saves
        self._hash_pool: ThreadPoolExecutor | None = None  # rank 0 hashes async saves' files here
        self._abandoned = threading.Event()  # set when the run fails: the background work of a save stops waiting
        self.last_blocking_s = 0.0
        self.last_commit: Committed | None = None
        self.on_commit: list = []  # callbacks (Committed, seconds from save start or None), on every rank
        self.on_blocked: list[Callable[[float], None]] = []  # seconds training waited on a checkpoint, per wait

    # ---- cadence: what the training loop calls ----------------------------------------------------------------

    def _of_subject(self) -> Subject:
        if self.subject is None:
            raise RuntimeError("this CheckpointManager was made without a subject: call save/load with the state instead")
        return self.subject

    def _blocked(self, seconds: float) -> float:
        for callback in self.on_blocked:
            callback(seconds)
        return seconds

    def maybe_save(self, step: int, metric: float | None) -> float:
        """Each step: start a save at every `interval_steps`, and commit a finished one. Seconds training was blocked."""
        blocked = 0.0
        if step % self.cfg.interval_steps == 0:
            subject = self._of_subject()
            blocked = self._blocked(self.save(step, subject.model, subject.optimizer, subject.trainer_state(), metric, blocking=False))
        self.poll()
        return blocked

    def final_save(self, step: int, metric: float | None) -> None:
        """At the end of the run: the last step is committed (unless it already was) before the run reports success."""
        self.wait()
        if self.last_commit is None or self.last_commit.step != step:
            subject = self._of_subject()
            self._blocked(self.save(step, subject.model, subject.optimizer, subject.trainer_state(), metric, blocking=True))

    def emergency_save(self, step: int, metric: float | None) -> bool:
        """On preemption: commit what is in flight, then save this step unless a checkpoint of it, or one newer than
        `emergency_skip_if_newer_than_s`, is already committed (the grace period is short). Whether it saved."""
        self.wait()
        last = self.last_commit
        recent = last is not None and (last.step == step or time.time() - last.committed_at <= self.cfg.emergency_skip_if_newer_than_s)
        # Rank 0 decides for all: each rank's clock (and its own commit time) differs, and ranks that disagreed would
        # leave some in the save's collectives waiting for ranks that had already exited.
        decision = torch.tensor([int(recent)])
        dist.broadcast(decision, src=0, group=self.pg)
        recent = bool(decision.item())
        if not recent:
            subject = self._of_subject()
            self._blocked(self.save(step, subject.model, subject.optimizer, subject.trainer_state(), metric, blocking=True))
        return not recent

    def adopt(self, source: Path | None) -> None:
        """A job that starts from another's checkpoint: rank 0 copies it in (checkpoint_files.start_from); every rank
        fails alike when it cannot."""
        if source is None:
            return
        problem: list[str | None] = [None]
        if self.rank == 0:
            try:
                start_from(source, self.directory)
            except UserError as exc:
                problem = [str(exc)]
        dist.broadcast_object_list(problem, src=0, group=self.pg)
        if problem[0]:
            raise UserError(problem[0])

    def load_latest(self) -> Resumed | None:
        """Resume the subject from the newest sound checkpoint, if there is one."""
        dist.barrier(group=self.pg)  # nobody scans the local tier while it is being filled
        latest = self.latest()
        if latest is None:
            return None
        subject = self._of_subject()
        saved, rng_restored = self.load(latest, subject.model, subject.optimizer)
        subject.load_trainer_state(saved)
        return Resumed(latest.step, latest.path, rng_restored)

    # ---- discovery ---------------------------------------------------------------------------------------

    def latest(self) -> Committed | None:
        """Newest committed checkpoint whose content checks out (every rank hashes its share of its files); partial or
        damaged newer ones are reported and removed by rank 0, whose view of the directory every rank goes by."""
        found: list[Any] = [scan(self.directory) if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0, group=self.pg)  # one list for all: the checks below are collective
        committed, rejected = found[0]
        while committed and (problem := self._content_problem(committed[-1].path)):
            rejected.append((committed.pop().path, f"damaged: {problem}"))
        if self.rank == 0:
            newest = committed[-1].step if committed else -1
            for path, reason in rejected:
                log.warning("ignoring checkpoint %s: %s%s", path, reason,
                            "; falling back to step %d" % newest if newest >= 0 else "")
                shutil.rmtree(path, ignore_errors=True)  # every rank is done with it: the checks were collective
        dist.barrier(group=self.pg)
        self.last_commit = committed[-1] if committed else None
        return self.last_commit

    def _content_problem(self, path: Path) -> str | None:
        """The checkpoint's damage, if any, with each rank hashing its share of the files: a resume's check spread over
        every node's disks and network (rank 0 hashed it all while the others waited, on a checkpoint of terabytes
        long enough to pass gloo's timeout); every rank gets the same verdict."""
        try:
            mine: tuple[str | None, str | None] = (content_problem(path, self.rank, self.world_size), None)
        except (OSError, ValueError) as exc:  # a file system error, not damage: nothing is thrown away for it
            mine = (None, f"rank {self.rank}: {exc}")
        said: list[Any] = [None] * self.world_size
        dist.all_gather_object(said, mine, group=self.pg)  # every rank answers, so none is left waiting
        unreadable = next((cannot for _, cannot in said if cannot), None)
        if unreadable:
            raise ServicesDown(f"{path}: its files cannot be read ({unreadable}); the checkpoint is kept, and the job restarts to "
                               "read it again")
        return next((problem for problem, _ in said if problem), None)

    # ---- save --------------------------------------------------------------------------------------------

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any],
             metric: float | None, *, blocking: bool) -> float:
        """Start (or, with blocking=True, complete) a checkpoint of `step`. Returns seconds training was blocked."""
        started = time.perf_counter()
        self.wait()  # one save in flight at a time bounds memory
        self._retire_spent_stager()
        path = self.directory / step_dir_name(step)
        if path.exists() and self.rank == 0:
            shutil.rmtree(path)  # an uncommitted leftover of this very step
        dist.barrier(group=self.pg)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(rng_state(), path / rng_file_name(self.rank))
        if self.rank == 0:
            torch.save(trainer_state, path / "trainer.pt")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        self.settle()
        if blocking or not self.cfg.async_save:
            dcp.save(state, checkpoint_id=str(path), process_group=self.pg)
            write_rank_digests(path, self.rank, self.world_size)
            self._every_rank_hashed(path)
            self._commit(step, path, metric, started, gather_digests(path, self.world_size) if self.rank == 0 else None)
        else:
            response = dcp.async_save(state, checkpoint_id=str(path), process_group=self.pg, async_stager=self._async_stager())
            future: Future[Any]
            if isinstance(response, AsyncSaveResponse):
                self._staging, future = response.staging_completion, response.upload_completion
            else:
                future = response
            # Each rank hashes what it wrote once written, off the training thread; rank 0's save ends after every
            # rank's writes, and it commits once every rank's checksums are in.
            def digests_once_written(written: Future[Any] = future) -> dict[str, str] | None:
                written.result()
                write_rank_digests(path, self.rank, self.world_size)
                return gather_digests(path, self.world_size, abandoned=self._abandoned) if self.rank == 0 else None
            future = self._hasher().submit(digests_once_written)
            self._pending = _Pending(step, path, metric, future, started)
        self.last_blocking_s = time.perf_counter() - started
        return self.last_blocking_s

    def _every_rank_hashed(self, path: Path) -> None:
        """Past this, every rank's checksums of `path` are on disk. A peer that died before writing its own fails the
        barrier at once (its connections reset), or after the checksums' patience if its node vanished silently: a
        retryable PeerLost either way, not a wait in gather_digests on the training thread."""
        try:
            dist.monitored_barrier(group=self.pg, timeout=datetime.timedelta(seconds=DIGESTS_TIMEOUT_S))
        except RuntimeError as exc:
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            said = lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}"  # gloo's: which rank, then why
            raise PeerLost(f"{path}: not every rank finished its part of the save ({said}); the checkpoint is not "
                           "committed") from exc

    def _hasher(self) -> ThreadPoolExecutor:
        if self._hash_pool is None:
            self._hash_pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-digest")
        return self._hash_pool

    def _async_stager(self):
        # The copy to staging buffers runs in the background too: forward and backward of the next step do not
        # touch parameters or optimizer state, so only the next optimizer step has to wait (wait_for_staging).
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            on_gpu = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=on_gpu, use_shared_memory=False,
                                                        use_async_staging=True, use_non_blocking_copy=on_gpu))
        return self._stager

    def _retire_spent_stager(self) -> None:
        # torch before 2.13 closes the DefaultStager's inner StateDictStager after every stage, which empties its
        # copy dispatch: a second stage through it fails on the first dict (`KeyError: <class 'type'>`, seen on an
        # H200 with torch 2.11 at the second checkpoint). Such a stager is built anew for the next save.
        stager = self._stager
        inner = getattr(stager, "_state_dict_stager", None)
        if stager is not None and inner is not None and not getattr(inner, "_deepcopy_dispatch", True):
            stager.close()
            self._stager = None

    def wait_for_staging(self) -> float:
        """Block until the in-flight save has copied the state; call before anything mutates it. Returns seconds."""
        waited = self._wait_for_staging()
        return self._blocked(waited) if waited else 0.0

    def _wait_for_staging(self) -> float:
        if self._staging is None:
            return 0.0
        started = time.perf_counter()
        self._staging.result()
        self._staging = None
        waited = time.perf_counter() - started
        self.last_blocking_s += waited
        return waited

    def poll(self) -> None:
        """Commit a finished async save without waiting for an unfinished one."""
        if self._pending is not None and self._pending.future.done():
            self.wait()

    def close(self) -> None:
        """Commit what is in flight, then shut the async stager down (its executor thread and its cached, on GPUs
        pinned, staging buffers), so nothing of it is left for interpreter teardown."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._hash_pool is not None:
            self._hash_pool.shutdown()
            self._hash_pool = None

    def abandon(self) -> None:
        """The run is failing (an exception leaves the loop): the save in flight would never be committed (only the
        training thread commits), so rank 0 stops waiting for every rank's checksums. It waited up to ten minutes for
        those of a peer that was gone, and interpreter teardown joins that thread (executor threads are joined at
        exit, shut down or not): the survivor of a SIGKILLed peer hung until torchrun killed it, 30 s later. What this
        does not end: DCP's own write of the save, and rank 0 hashing its own files, still finish before the process
        exits. Nothing is lost: resume takes the last committed checkpoint. Final: this manager saves no more."""
        self._abandoned.set()
        self._pending = None
        if self._hash_pool is not None:
            self._hash_pool.shutdown(wait=False)
            self._hash_pool = None

    def wait(self) -> None:
        self._wait_for_staging()
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        digests = pending.future.result()
        self._commit(pending.step, pending.path, pending.metric, pending.started, digests if self.rank == 0 else None)

    def _commit(self, step: int, path: Path, metric: float | None, started: float | None,
                digests: dict[str, str] | None = None) -> None:
        # Rank 0's save finishes only after every rank reported its writes (DCP gathers them before writing
        # .metadata), and each rank wrote its rng file before joining the save: everything is on disk.
        if self.rank == 0:
            committed = write_manifest(path, step, metric, self.world_size, digests)
            self._prune()
        else:
            committed = Committed(step, path, metric, time.time())
        self.last_commit = committed
        for callback in self.on_commit:
            callback(committed, time.perf_counter() - started if started is not None else None)

    def _prune(self) -> None:
        committed, _ = scan(self.directory)
        keep = {c.step for c in committed[-self.cfg.keep_last:]}
        scored = [c for c in committed if c.metric is not None]
        if self.cfg.keep_best and scored:
            pick = max if self.metric_mode == "max" else min
            keep.add(pick(scored, key=lambda c: c.metric if c.metric is not None else 0.0).step)  # scored: metric set
        for c in committed:
            if c.step not in keep:
                shutil.rmtree(c.path, ignore_errors=True)

    def export_full_model(self, path: Path) -> None:
        """The subject's full (unsharded) parameters in one file, written by rank 0 (every rank joins the gather): for
        hand-off, and for tests that compare runs bit for bit."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(self._of_subject().model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            torch.save(full, path)

    # ---- load --------------------------------------------------------------------------------------------

    def load(self, checkpoint: Committed, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], bool]:
        """Restore model and optimizer (resharding as needed); return trainer state and whether RNG was restored."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        trainer_state = load_data(checkpoint.path / "trainer.pt")  # first: refuse a bad checkpoint before touching the model
        reader = SafeReader(checkpoint.path)
        reader.read_metadata()  # here, not inside DCP's collective: a refusal reaches the user as itself
        try:
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(checkpoint.path), process_group=self.pg)
        except CheckpointException as e:  # DCP gathers every rank's failure: a refusal reaches the user as itself
            failures = [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
            unsafe = next((f for f in failures if isinstance(f, UnsafeCheckpoint)), None)
            if unsafe is not None:
                raise unsafe from None
            raise
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rng_file = checkpoint.path / rng_file_name(self.rank)
        same_world = saved_world_size(checkpoint.path) == self.world_size
        if same_world and rng_file.exists():
            set_rng_state(load_data(rng_file))
        return trainer_state, same_world
