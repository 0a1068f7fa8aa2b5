"""Checkpoint checksums: one rank hashing every rank's files (before) against each rank hashing its own, side by side.

    python benchmarks/bench_checkpoint_hash.py [--gib 1] [--ranks 2] [--repeats 3]

A checkpoint directory of `--gib` GiB is laid out as DCP writes it for `--ranks` ranks (two shard files per rank, an
RNG file each, .metadata and trainer.pt), with random bytes. Three ways of getting the manifest's SHA-256s:
- before: rank 0 hashes every file, one after another (what each save cost until issue 38);
- per rank: each rank, as its own process, hashes the files it wrote (`write_rank_digests`), and rank 0 folds them in
  (`gather_digests`): what a save costs now;
- the resume check (`content_problem`): the newest checkpoint's files hashed in parallel threads on rank 0, against one
  after another before; and each rank, as its own process, checking its share (`share_of`, by size), as a resume does
  now.
The ratio is the before time over the new one, measured in the same run. On a p5 the ranks are 8 processes on 192
vCPUs, and a multi-node job's shares are read over every node's network; here they share this machine's cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def lay_out(directory: Path, total_bytes: int, ranks: int) -> None:
    shard = total_bytes // (2 * ranks)
    chunk = os.urandom(1 << 20)
    for rank in range(ranks):
        for n in range(2):
            with open(directory / f"__{rank}_{n}.distcp", "wb") as f:
                for _ in range(shard >> 20):
                    f.write(chunk)
        (directory / f"rng-rank{rank}.pt").write_bytes(os.urandom(8192))
    (directory / ".metadata").write_bytes(os.urandom(65536))
    (directory / "trainer.pt").write_bytes(os.urandom(4096))


def before(directory: Path) -> dict[str, str]:
    """The old rank-0 pass: every file, one after another."""
    digests = {}
    for f in sorted(directory.iterdir()):
        if f.is_file():
            with open(f, "rb") as stream:
                digests[f.name] = hashlib.file_digest(stream, "sha256").hexdigest()
    return digests


def _rank_hashes(args: tuple[str, int, int]) -> None:
    from trainforge.trainer.runtime.checkpoint_files import write_rank_digests
    directory, rank, ranks = args
    write_rank_digests(Path(directory), rank, ranks)


def _rank_checks(args: tuple[str, int, int]) -> str | None:
    from trainforge.trainer.runtime.checkpoint_files import content_problem
    directory, rank, ranks = args
    return content_problem(Path(directory), rank, ranks)


def shared_check(directory: Path, ranks: int, pool: ProcessPoolExecutor) -> str | None:
    return next((problem for problem in pool.map(_rank_checks, [(str(directory), r, ranks) for r in range(ranks)]) if problem), None)


def per_rank(directory: Path, ranks: int, pool: ProcessPoolExecutor) -> dict[str, str]:
    from trainforge.trainer.runtime.checkpoint_files import gather_digests
    list(pool.map(_rank_hashes, [(str(directory), r, ranks) for r in range(ranks)]))
    return gather_digests(directory, ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 MiB, one repeat (CI runs this)")
    args = parser.parse_args()
    if args.quick:
        args.gib, args.repeats = 1 / 16, 1
    from trainforge.trainer.runtime import checkpoint_files
    times: dict[str, list[float]] = {"save: before (rank 0 hashes all)": [], "save: per rank": [],
                                     "resume check: before (one by one)": [], "resume check: parallel": [],
                                     "resume check: each rank its share": []}
    with tempfile.TemporaryDirectory(prefix="bench-hash-") as tmp, ProcessPoolExecutor(args.ranks) as pool:
        directory = Path(tmp)
        lay_out(directory, int(args.gib * 2**30), args.ranks)
        for _ in range(args.repeats):  # interleaved, so the page cache and drift hit every way alike
            started = time.perf_counter()
            old = before(directory)
            times["save: before (rank 0 hashes all)"].append(time.perf_counter() - started)
            started = time.perf_counter()
            new = per_rank(directory, args.ranks, pool)
            times["save: per rank"].append(time.perf_counter() - started)
            assert new == old, "the same checksums either way"
            (directory / checkpoint_files.COMMIT_MARKER).write_text(json.dumps({"sha256": new}))
            started = time.perf_counter()
            before(directory)
            times["resume check: before (one by one)"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert checkpoint_files.content_problem(directory) is None
            times["resume check: parallel"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert shared_check(directory, args.ranks, pool) is None
            times["resume check: each rank its share"].append(time.perf_counter() - started)
            (directory / checkpoint_files.COMMIT_MARKER).unlink()
    median = {name: statistics.median(samples) for name, samples in times.items()}
    table = Table(title=f"Checkpoint SHA-256 of {args.gib:g} GiB over {args.ranks} ranks, median of {args.repeats} "
                        f"({os.cpu_count()} cores)", title_justify="left")
    for column in ("what", "median s", "GiB/s", "speed-up vs before"):
        table.add_column(column)
    pairs = {"save: per rank": "save: before (rank 0 hashes all)", "resume check: parallel": "resume check: before (one by one)",
             "resume check: each rank its share": "resume check: before (one by one)"}
    for name, seconds in median.items():
        ratio = f"{median[pairs[name]] / seconds:.2f}x" if name in pairs else ""
        table.add_row(name, f"{seconds:.3f}", f"{args.gib / seconds:.2f}", ratio)
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
