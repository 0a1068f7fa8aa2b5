"""Checkpoints with torch.distributed.checkpoint: one directory per step, visible only once committed.

Layout of `<dir>/step-00000120/`:
  .metadata, __<rank>_0.distcp   model + optimizer, sharded by DCP (reshardable: N ranks save, M ranks load)
  trainer.pt                     scheduler, sampler position, step, metrics, best value (rank 0)
  rng-rank<r>.pt                 each rank's RNG states (used when the world size is unchanged)
  COMMITTED                      written last, atomically, by rank 0: a manifest of every file, its size and SHA-256

A directory without COMMITTED, or whose files no longer match the manifest (truncated, missing), is not a
checkpoint: discovery skips it with a warning, and rank 0 removes it. Before resuming, rank 0 also checks the content of
the newest one against its checksums (a same-size corruption would otherwise load garbage weights or fail the job) and
falls back to the one before, saying which; everyone resumes from rank 0's choice. The checksums of an async save are
computed in the background, after its files are written and before it is committed.

Loading never runs code from the files: tensors and trainer state through `torch.load(weights_only=True)` (data only:
tensors, numbers, strings, lists, dicts), DCP's `.metadata` through an unpickler that builds only DCP's own metadata
classes and torch's dtypes. A file that asks for anything else is refused (`UnsafeCheckpoint`), never executed: a
checkpoint is input, and whoever could write it must not be able to run code in the job that reads it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import random
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from trainforge import paths
from trainforge.trainer.runtime.config import CheckpointConfig, UserError

log = logging.getLogger("trainforge.runtime")
COMMIT_MARKER = paths.CHECKPOINT_COMMIT_MARKER
STEP_PREFIX = paths.CHECKPOINT_STEP_PREFIX


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


@dataclass(frozen=True)
class Committed:
    step: int
    path: Path
    metric: float | None
    committed_at: float


def _manifest_problem(path: Path, manifest: dict[str, Any]) -> str | None:
    for name, size in manifest["files"].items():
        f = path / name
        if not f.exists():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} is {f.stat().st_size} bytes, the manifest says {size}"
    return None


def file_digests(path: Path) -> dict[str, str]:
    """SHA-256 of every file of a checkpoint directory (DCP's .metadata included) but the commit marker."""
    digests = {}
    for f in sorted(path.iterdir()):
        if f.is_file() and f.name not in (COMMIT_MARKER, f".{COMMIT_MARKER}.tmp"):
            with open(f, "rb") as stream:
                digests[f.name] = hashlib.file_digest(stream, "sha256").hexdigest()
    return digests


def content_problem(path: Path) -> str | None:
    """Which file of a committed checkpoint no longer has the content its manifest recorded (None: all do, or the
    manifest predates checksums)."""
    recorded = json.loads((path / COMMIT_MARKER).read_text()).get("sha256")
    if not recorded:
        return None
    for name, digest in recorded.items():
        with open(path / name, "rb") as stream:
            if hashlib.file_digest(stream, "sha256").hexdigest() != digest:
                return f"{name} does not match its checksum (same size, other content)"
    return None


def scan(directory: Path) -> tuple[list[Committed], list[tuple[Path, str]]]:
    """Committed checkpoints (oldest first) and rejected directories with the reason."""
    committed, rejected = [], []
    if not directory.exists():
        return committed, rejected
    for path in sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)):
        marker = path / COMMIT_MARKER
        if not marker.exists():
            rejected.append((path, "no commit marker (the save never finished)"))
            continue
        try:
            manifest = json.loads(marker.read_text())
        except (OSError, ValueError) as exc:
            rejected.append((path, f"unreadable commit marker ({exc})"))
            continue
        problem = _manifest_problem(path, manifest)
        if problem:
            rejected.append((path, f"damaged: {problem}"))
            continue
        committed.append(Committed(manifest["step"], path, manifest.get("metric"), manifest["committed_at"]))
    committed.sort(key=lambda c: c.step)
    return committed, rejected


def start_from(source: Path, directory: Path) -> Committed | None:
    """A job that starts from another's checkpoint (a sweep's best trial, promoted): when `directory` has no committed
    checkpoint of its own, the newest sound one in `source` is copied in (under a temporary name, renamed when whole),
    and the run resumes from it like from its own. A job that has checkpoints of its own continues from those."""
    if scan(directory)[0]:
        return None
    committed, _ = scan(source)
    while committed and content_problem(committed[-1].path):
        committed.pop()
    if not committed:
        raise UserError(f"checkpoint.start_from: {source} holds no sound committed checkpoint. Fix: start from a job that "
                        "checkpointed (its checkpoint.interval_steps below its max_steps), or drop start_from")
    chosen = committed[-1]
    directory.mkdir(parents=True, exist_ok=True)
    incoming = directory / f".incoming-{chosen.path.name}"
    shutil.rmtree(incoming, ignore_errors=True)
    shutil.copytree(chosen.path, incoming)
    os.rename(incoming, directory / chosen.path.name)
    _fsync_dir(directory)
    log.info("starting from %s (step %d)", chosen.path, chosen.step)
    return chosen


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UnsafeCheckpoint(UserError):
    """A checkpoint file that would run code (or build objects other than data) when loaded: not retried, since
    loading it again would meet the same file."""


def rng_state() -> dict[str, Any]:
    """Every generator's state as plain data (numpy's key array as a tensor), loadable with weights_only=True."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state((numpy["name"], numpy["key"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))


def load_data(path: Path) -> Any:
    """A torch.save'd file of data only; anything that would construct other objects is refused with the reason."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpoint(f"{path}: holds more than data (tensors, numbers, strings, lists, dicts), so it is not "
                               f"loaded: {str(e).splitlines()[0]}. A trainforge job never writes such a file; if this "
                               "checkpoint was written by an older trainforge or by anyone else, remove its directory to "
                               "resume from the one before") from None


# What DCP's .metadata pickle may build: DCP's own metadata classes (plain dataclasses), torch.Size and torch's dtype,
# layout and memory-format singletons, and the path the writer recorded.
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_METADATA_GLOBALS = {("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
                     ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in _METADATA_GLOBALS:
                return super().find_class(module, name)
            if module in _METADATA_MODULES:
                found = super().find_class(module, name)
                if isinstance(found, type) and found.__module__ == module:  # a class defined there, not an import
                    return found
            if module == "torch":
                found = getattr(torch, name, None)
                if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
                    return found
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in checkpoint metadata")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader with the metadata read by `_MetadataUnpickler` (tensors it already loads weights_only)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            try:
                metadata = _MetadataUnpickler(io.BytesIO(stream.read())).load()
            except pickle.UnpicklingError as e:
                raise UnsafeCheckpoint(f"{path}: {e}; the checkpoint is not loaded (remove its directory to resume from "
                                       "the one before)") from None
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


@dataclass
class _Pending:
    step: int
    path: Path
    metric: float | None
    future: Future
    started: float


class CheckpointManager:
    """Saves, commits, prunes and finds checkpoints. Every rank calls every method; rank 0 does the bookkeeping."""

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, metric_mode: str, process_group: dist.ProcessGroup):
        self.cfg, self.rank, self.world_size, self.metric_mode = cfg, rank, world_size, metric_mode
        self.directory = Path(cfg.dir)
        # Checkpoint collectives run in a background thread; their own gloo group keeps them from
        # interleaving with the training loop's collectives on the default group.
        self.pg = process_group
        self._pending: _Pending | None = None
        self._staging: Future | None = None
        self._stager = None  # created on the first async save; keeps its staging buffers between saves
        self._hash_pool: ThreadPoolExecutor | None = None  # rank 0 hashes async saves' files here
        self.last_blocking_s = 0.0
        self.last_commit: Committed | None = None
        self.on_commit: list = []  # callbacks (Committed, seconds from save start or None), on every rank

    # ---- discovery ---------------------------------------------------------------------------------------

    def latest(self) -> Committed | None:
        """Newest committed checkpoint whose content checks out; partial or damaged newer ones are reported and
        removed by rank 0, whose choice every rank resumes from."""
        committed, rejected = scan(self.directory)
        if self.rank == 0:
            while committed and (problem := content_problem(committed[-1].path)):
                rejected.append((committed.pop().path, f"damaged: {problem}"))
            newest = committed[-1].step if committed else -1
            for path, reason in rejected:
                log.warning("ignoring checkpoint %s: %s%s", path, reason,
                            "; falling back to step %d" % newest if newest >= 0 else "")
        choice = [committed[-1].step if committed else -1]
        dist.broadcast_object_list(choice, src=0, group=self.pg)  # also: everyone has looked before rank 0 removes
        if self.rank == 0:
            for path, _ in rejected:
                shutil.rmtree(path, ignore_errors=True)
        dist.barrier(group=self.pg)
        step = choice[0]
        self.last_commit = None if step < 0 else next(
            (c for c in committed if c.step == step), Committed(step, self.directory / step_dir_name(step), None, 0.0))
        return self.last_commit

    # ---- save --------------------------------------------------------------------------------------------

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any],
             metric: float | None, *, blocking: bool) -> float:
        """Start (or, with blocking=True, complete) a checkpoint of `step`. Returns seconds training was blocked."""
        started = time.perf_counter()
        self.wait()  # one save in flight at a time bounds memory
        path = self.directory / step_dir_name(step)
        if path.exists() and self.rank == 0:
            shutil.rmtree(path)  # an uncommitted leftover of this very step
        dist.barrier(group=self.pg)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(rng_state(), path / f"rng-rank{self.rank}.pt")
        if self.rank == 0:
            torch.save(trainer_state, path / "trainer.pt")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        if blocking or not self.cfg.async_save:
            dcp.save(state, checkpoint_id=str(path), process_group=self.pg)
            self._commit(step, path, metric, started)
        else:
            response = dcp.async_save(state, checkpoint_id=str(path), process_group=self.pg, async_stager=self._async_stager())
            if isinstance(response, AsyncSaveResponse):
                self._staging, future = response.staging_completion, response.upload_completion
            else:
                future = response
            if self.rank == 0:  # rank 0's save ends after every rank's writes: then hash them, off the training thread
                future = self._hasher().submit(lambda written=future: (written.result(), file_digests(path))[1])
            self._pending = _Pending(step, path, metric, future, started)
        self.last_blocking_s = time.perf_counter() - started
        return self.last_blocking_s

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

    def wait_for_staging(self) -> float:
        """Block until the in-flight save has copied the state; call before anything mutates it. Returns seconds."""
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

    def wait(self) -> None:
        self.wait_for_staging()
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
            files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != COMMIT_MARKER}
            manifest = {"step": step, "metric": metric, "world_size": self.world_size, "committed_at": time.time(), "files": files,
                        "sha256": digests if digests is not None else file_digests(path)}
            tmp = path / f".{COMMIT_MARKER}.tmp"
            with open(tmp, "w") as f:
                json.dump(manifest, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path / COMMIT_MARKER)
            _fsync_dir(path)
            committed = Committed(step, path, metric, manifest["committed_at"])
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
            keep.add(pick(scored, key=lambda c: c.metric).step)
        for c in committed:
            if c.step not in keep:
                shutil.rmtree(c.path, ignore_errors=True)

    # ---- load --------------------------------------------------------------------------------------------

    def load(self, checkpoint: Committed, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], bool]:
        """Restore model and optimizer (resharding as needed); return trainer state and whether RNG was restored."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        trainer_state = load_data(checkpoint.path / "trainer.pt")  # first: refuse a bad checkpoint before touching the model
        reader = SafeReader(checkpoint.path)
        reader.read_metadata()  # here, not inside DCP's collective: a refusal reaches the user as itself
        dcp.load(state, storage_reader=reader, process_group=self.pg)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rng_file = checkpoint.path / f"rng-rank{self.rank}.pt"
        same_world = json.loads((checkpoint.path / COMMIT_MARKER).read_text())["world_size"] == self.world_size
        if same_world and rng_file.exists():
            set_rng_state(load_data(rng_file))
        return trainer_state, same_world
