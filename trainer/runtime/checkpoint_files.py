"""What a checkpoint is on disk, and how it is read safely: one directory per step, visible only once committed.

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
tensors, numbers, strings, lists, dicts), the non-tensor values DCP keeps inside the shards (the optimizer's
`param_groups`: learning rates, betas, flags) the same way through `SafeLoadPlanner` (DCP's default planner unpickles
them with `weights_only=False`), DCP's `.metadata` through an unpickler that builds only DCP's own metadata classes and
torch's dtypes. A file that asks for anything else is refused (`UnsafeCheckpoint`), never executed: a
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from trainforge import paths
from trainforge.trainer.runtime.config import PeerLost, UserError

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


RANK_DIGESTS = ".sha256-rank"  # + "<rank>.json": one rank's checksums, until rank 0 folds them into the manifest
HASH_THREADS = 8  # hashlib releases the GIL on large buffers: files hash in parallel, one per core


def _sha256(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _hash_all(files: list[Path]) -> dict[str, str]:
    if len(files) <= 1:
        return {f.name: _sha256(f) for f in files}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(HASH_THREADS, len(files)), thread_name_prefix="checkpoint-sha256") as pool:
        return dict(zip((f.name for f in files), pool.map(_sha256, files)))


def _checkpoint_files(path: Path) -> list[Path]:
    return [f for f in sorted(path.iterdir()) if f.is_file() and f.name not in (COMMIT_MARKER, f".{COMMIT_MARKER}.tmp")
            and not f.name.startswith(RANK_DIGESTS)]


def file_digests(path: Path) -> dict[str, str]:
    """SHA-256 of every file of a checkpoint directory (DCP's .metadata included) but the commit marker."""
    return _hash_all(_checkpoint_files(path))


def rng_file_name(rank: int) -> str:
    """Rank `rank`'s RNG states in a checkpoint (see the module doc)."""
    return f"rng-rank{rank}.pt"


def own_files(path: Path, rank: int, world_size: int) -> list[Path]:
    """The files rank `rank` wrote: its DCP shards (`__<rank>_<n>.distcp`) and RNG file; rank 0 also DCP's .metadata,
    trainer.pt and anything no rank's name claims."""
    def writer(name: str) -> int:
        for r in range(world_size):
            if name.startswith(f"__{r}_") or name == rng_file_name(r):
                return r
        return 0
    return [f for f in _checkpoint_files(path) if writer(f.name) == rank]


def write_rank_digests(path: Path, rank: int, world_size: int) -> None:
    """This rank's checksums, of the files it wrote, hashed on its own node while the others hash theirs (a rank-0
    pass over every rank's shards took minutes per save at billions of parameters)."""
    digests = _hash_all(own_files(path, rank, world_size))
    tmp = path / f"{RANK_DIGESTS}{rank}.json.tmp"  # under the prefix no listing of checkpoint files includes
    tmp.write_text(json.dumps(digests))
    os.replace(tmp, path / f"{RANK_DIGESTS}{rank}.json")


class SaveAbandoned(RuntimeError):
    """The run is failing: the save in flight will not be committed, and nothing waits for it any longer."""


DIGESTS_TIMEOUT_S = 600.0  # how long rank 0 waits for every rank's checksums before taking a rank for gone


def gather_digests(path: Path, world_size: int, timeout_s: float = DIGESTS_TIMEOUT_S, abandoned: threading.Event | None = None) -> dict[str, str]:
    """Rank 0: every rank's checksums, once each has written them (every rank's writes are done by then: DCP's
    save ended), merged and the per-rank files removed. SaveAbandoned as soon as `abandoned` is set: a peer that died
    writes none, and this wait would otherwise hold the failing process's exit. PeerLost (a retry, not the job's
    fault) when a rank's checksums have not come within `timeout_s`."""
    files = [path / f"{RANK_DIGESTS}{r}.json" for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    while not all(f.exists() for f in files):
        if abandoned is not None and abandoned.is_set():
            raise SaveAbandoned(f"{path}: the run failed before every rank's checksums were in; the checkpoint is not committed")
        if time.monotonic() > deadline:  # a rank that has not hashed its own files in this long is gone
            missing = [f.name for f in files if not f.exists()]
            raise PeerLost(f"{path}: no checksums from {missing} within {timeout_s:.0f} s; the checkpoint is not committed")
        time.sleep(0.05)
    merged: dict[str, str] = {}
    for f in files:
        merged.update(json.loads(f.read_text()))
        f.unlink()
    return merged


def share_of(sizes: dict[str, int], part: int, parts: int) -> list[str]:
    """The files (by name, from their sizes) that `part` of `parts` checks: the biggest first, each to the least loaded
    part, so the parts finish together; every rank computes the same split from the same manifest."""
    load = [0] * parts
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        least = load.index(min(load))
        load[least] += sizes[name]
        if least == part:
            mine.append(name)
    return sorted(mine)


def content_problem(path: Path, part: int = 0, parts: int = 1) -> str | None:
    """Which file of a committed checkpoint no longer has the content its manifest recorded (None: all do, or the
    manifest predates checksums), among the files of `part` of `parts` (share_of: each rank checks its share). Files
    hash in parallel."""
    manifest = json.loads((path / COMMIT_MARKER).read_text())
    recorded = manifest.get("sha256")
    if not recorded:
        return None
    names = share_of({name: manifest.get("files", {}).get(name, 0) for name in recorded}, part, parts)
    found = _hash_all([path / name for name in names])
    for name in names:
        if found[name] != recorded[name]:
            return f"{name} does not match its checksum (same size, other content)"
    return None


def scan(directory: Path) -> tuple[list[Committed], list[tuple[Path, str]]]:
    """Committed checkpoints (oldest first) and rejected directories with the reason."""
    committed: list[Committed] = []
    rejected: list[tuple[Path, str]] = []
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
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]  # the legacy tuple form
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"name": name, "key": torch.from_numpy(np.asarray(key).astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's device (dropout and other random ops on the GPU)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # a GPU checkpoint resumed on a CPU keeps the CPU generators only
        torch.cuda.set_rng_state(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state((numpy["name"], numpy["key"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))


def unpickling_reason(error: pickle.UnpicklingError) -> str:
    """The line of torch's refusal that names what the file asked for ("unsupported GLOBAL posix.system ..."), not its
    preamble (which suggests loading with weights_only=False: exactly what must not happen here)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "global" in line or "Unsupported" in line]
    return (named or lines or ["unreadable"])[0][:200]


def load_data(path: Path) -> Any:
    """A torch.save'd file of data only; anything that would construct other objects is refused with the reason."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpoint(f"{path}: holds more than data (tensors, numbers, strings, lists, dicts), so it is not "
                               f"loaded: {unpickling_reason(e)}. A trainforge job never writes such a file; if this "
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


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that a non-tensor value stored in a shard is read as data only (its
    `load_bytes`, otherwise the same: torch 2.13 default_planner.py)."""

    def __init__(self, checkpoint: Path):
        super().__init__()
        self.checkpoint = checkpoint

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpoint(f"{self.checkpoint}: the value of {read_item.dest_index.fqn!r} in its .distcp shards holds "
                                   f"more than data, so it is not loaded: {unpickling_reason(e)}. Remove the checkpoint's "
                                   "directory to resume from the one before") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


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




def write_manifest(path: Path, step: int, metric: float | None, world_size: int, digests: dict[str, str] | None) -> Committed:
    """Commit a written checkpoint (rank 0, after every rank's writes): the manifest of every file, its size and
    SHA-256, written under a temporary name and renamed, then the directory synced, so a crash leaves none or all."""
    files = {p.name: p.stat().st_size for p in _checkpoint_files(path)}
    committed_at = time.time()
    manifest = {"step": step, "metric": metric, "world_size": world_size, "committed_at": committed_at, "files": files,
                "sha256": digests if digests is not None else file_digests(path)}
    tmp = path / f".{COMMIT_MARKER}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / COMMIT_MARKER)
    _fsync_dir(path)
    return Committed(step, path, metric, committed_at)


def saved_world_size(path: Path) -> int:
    return json.loads((path / COMMIT_MARKER).read_text())["world_size"]
