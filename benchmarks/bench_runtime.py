"""Runtime benchmarks, each a ratio or a duration measured side by side in one run (never a pass/fail test).

  1. throughput: the runtime's loop vs a plain hand-written PyTorch loop, same model, batch and optimizer
  2. checkpoint: training time blocked by an async save vs a synchronous save of the same >= 200 MB state
  3. SIGKILL of a worker -> first resumed step (the whole group restarted from the last checkpoint)
  4. SIGTERM -> committed emergency checkpoint of a >= 200 MB state, 2 ranks

    python benchmarks/bench_runtime.py [--only throughput checkpoint sigkill sigterm] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=150)
BIG_MODEL = {"width": 2048, "depth": 5}  # 16.9 M parameters: 202 MB with AdamW's two moments
THROUGHPUT_STEPS, THROUGHPUT_WARMUP = 150, 20


def quick() -> None:
    """--quick: a small model and few steps, so CI shows the script still runs (its numbers mean little)."""
    global BIG_MODEL, THROUGHPUT_STEPS, THROUGHPUT_WARMUP
    BIG_MODEL, THROUGHPUT_STEPS, THROUGHPUT_WARMUP = {"width": 256, "depth": 2}, 40, 10


def _state_mb(task) -> float:
    params = sum(p.numel() for p in task.build_model().parameters())
    return params * 4 * 3 / 1e6


# ---- 1. throughput --------------------------------------------------------------------------------------------

LOG_EVERY = 10  # the runtime reads the loss every 10 steps; both loops are timed over the same 10-step windows


def windowed_rate(steps: list[int], times: list[float], warmup: int) -> float:
    """Median of steps/second over consecutive windows, after the warm-up steps."""
    pairs = [(s, t) for s, t in zip(steps, times) if s > warmup]
    return statistics.median((b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(pairs, pairs[1:]))


def plain_loop_steps_per_s(task, cfg, steps: int, warmup: int) -> float:
    """A hand-written loop: AdamW, warmup+cosine, clipping, shuffled DataLoader, the loss read every LOG_EVERY steps."""
    import torch

    from trainforge.trainer.runtime.build import lr_lambda
    torch.manual_seed(cfg.seed)
    model = task.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    loader = torch.utils.data.DataLoader(task.train_set, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(cfg.seed))
    batches = iter(loader)
    logged_steps, logged_at = [], []
    for step in range(1, steps + 1):
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        loss, _ = task.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % LOG_EVERY == 0:
            loss.item()  # what any real loop does to print its loss
            logged_steps.append(step)
            logged_at.append(time.perf_counter())
    return windowed_rate(logged_steps, logged_at, warmup)


def runtime_steps_per_s(task, cfg, env, guard, warmup: int) -> float:
    """The runtime's loop, everything on (metrics, JSONL log, per-step agreement), over the same windows."""
    from trainforge.trainer.runtime.loop import Trainer
    Trainer(task, cfg, env).run(guard)
    records = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]
    logged = sorted((r["step"], r["t"]) for r in records if "loss" in r)
    return windowed_rate([s for s, _ in logged], [t for _, t in logged], warmup)


def bench_throughput(repeats: int) -> list[tuple]:
    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.runtime.distributed import init_distributed
    from trainforge.trainer.runtime.preemption import PreemptionGuard
    from trainforge.trainer.runtime.tasks import load_task

    env, guard = init_distributed(), PreemptionGuard(30)
    steps, warmup = THROUGHPUT_STEPS, THROUGHPUT_WARMUP
    rows = []
    for task_name, batch in (("char_lm", 32), ("classifier", 256)):
        task = load_task(task_name)
        plain, runtime = [], []
        for _ in range(repeats):  # interleaved, so drift on a shared machine hits both alike
            with tempfile.TemporaryDirectory() as tmp:
                cfg = RunConfig.model_validate({"task": task_name, "max_steps": steps, "batch_size": batch, "eval_every": 10_000,
                                                "log_every": LOG_EVERY,
                                                "eval_batches": 1, "output_dir": f"{tmp}/run", "warmup_steps": 10,
                                                "checkpoint": {"dir": f"{tmp}/ckpt", "interval_steps": 10_000}})
                plain.append(plain_loop_steps_per_s(task, cfg, steps, warmup))
                runtime.append(runtime_steps_per_s(task, cfg, env, guard, warmup))
        # Each pair ran back to back, so machine drift cancels within a pair: report the median pair ratio.
        ratios = sorted(r / p for p, r in zip(plain, runtime))
        rows.append((f"throughput, {task_name} (batch {batch}), 1 process",
                     f"plain {statistics.median(plain):.1f}, runtime {statistics.median(runtime):.1f} steps/s; "
                     f"pair ratios {ratios[0]:.3f}-{ratios[-1]:.3f}", f"{statistics.median(ratios):.3f}", ">= 0.99"))
    return rows


# ---- 2. async vs sync checkpoint ------------------------------------------------------------------------------

def bench_checkpoint(repeats: int) -> list[tuple]:
    import torch
    import torch.distributed as dist

    from trainforge.trainer.runtime.checkpoint import CheckpointManager
    from trainforge.trainer.runtime.config import CheckpointConfig
    from trainforge.trainer.runtime.distributed import init_distributed
    from trainforge.trainer.runtime.tasks import load_task

    env = init_distributed() if not dist.is_initialized() else None
    group = env.checkpoint_group if env else dist.new_group(backend="gloo")
    task = load_task("classifier", **BIG_MODEL)
    model = task.build_model()
    optimizer = torch.optim.AdamW(model.parameters())
    batch = next(iter(torch.utils.data.DataLoader(task.train_set, batch_size=256)))

    def train(n: int, manager=None) -> tuple[float, float]:
        """n training steps; returns (seconds, seconds blocked waiting for an async checkpoint's staging)."""
        started, blocked = time.perf_counter(), 0.0
        for _ in range(n):
            loss, _ = task.loss(model, batch)
            loss.backward()
            if manager is not None:
                blocked += manager.wait_for_staging()  # as the runtime does before every optimizer step
            optimizer.step()
            optimizer.zero_grad()
        return time.perf_counter() - started, blocked

    train(2)  # AdamW state exists: the full 200 MB
    sync_s, async_s, idle_s, overlapped_s = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        manager = CheckpointManager(CheckpointConfig(dir=Path(tmp), keep_last=1), rank=0, world_size=1, metric_mode="max",
                                    process_group=group)
        step = 0
        for i in range(repeats + 1):  # the first async save allocates the stager's buffers: not counted
            step += 1
            sync = manager.save(step, model, optimizer, {}, None, blocking=True)
            step += 1
            call = manager.save(step, model, optimizer, {}, None, blocking=False)
            overlapped, staging_wait = train(5, manager)  # training while the background copy and write run
            manager.wait()
            idle, _ = train(5)
            if i:
                sync_s.append(sync)
                async_s.append(call + staging_wait)
                overlapped_s.append(overlapped)
                idle_s.append(idle)
    s, a = statistics.median(sync_s), statistics.median(async_s)
    o, i = statistics.median(overlapped_s), statistics.median(idle_s)
    return [
        (f"checkpoint of {_state_mb(task):.0f} MB: time training is blocked", f"sync {s * 1000:.0f} ms, async {a * 1000:.0f} ms",
         f"{a / s:.3f}", "<= 0.05"),
        ("5 steps while the async write runs vs 5 idle steps", f"{o * 1000:.0f} ms vs {i * 1000:.0f} ms", f"{o / i:.2f}", "(2 cores shared)"),
    ]


# ---- 3 & 4. signals under torchrun ------------------------------------------------------------------------------

def _torchrun(workdir: Path, overrides: list[str]) -> subprocess.Popen:
    sets = [a for o in overrides for a in ("--set", o)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "trainforge.trainer.runtime", *sets]
    return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _steps(workdir: Path) -> list[dict]:
    path = workdir / "run" / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if "loss" in r]


def _wait(predicate, timeout: float = 300.0, poll: float = 0.01):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError


def bench_sigkill(repeats: int) -> list[tuple]:
    detect, total = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            overrides = ["max_steps=100000", "checkpoint.interval_steps=10", "step_sleep_s=0.01", "eval_every=100000"]
            job = _torchrun(workdir, overrides)
            _wait(lambda: any(r["step"] >= 30 for r in _steps(workdir)))
            rank1 = int((workdir / "run" / "pids" / "rank1.pid").read_text())
            killed_at = time.time()
            os.kill(rank1, signal.SIGKILL)
            job.wait(120)
            detected = time.time()
            job = _torchrun(workdir, overrides)  # what the supervisor does: the whole group, fresh rendezvous
            resumed = _wait(lambda: next((r for r in _steps(workdir) if r["t"] > detected), None))
            detect.append(detected - killed_at)
            total.append(resumed["t"] - killed_at)
            job.send_signal(signal.SIGTERM)
            job.wait(120)
    return [("SIGKILL of rank 1 -> first resumed step (2 ranks)",
             f"group torn down in {statistics.median(detect):.2f} s, restart+resume {statistics.median(total) - statistics.median(detect):.2f} s",
             f"{statistics.median(total):.2f} s", "<= 10 s")]


def bench_sigterm(repeats: int) -> list[tuple]:
    from trainforge.trainer.runtime.tasks import load_task
    seconds = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            job = _torchrun(workdir, ["max_steps=100000", "checkpoint.interval_steps=100000", "eval_every=100000", "batch_size=64",
                                      f"task_args.width={BIG_MODEL['width']}", f"task_args.depth={BIG_MODEL['depth']}"])
            _wait(lambda: any(r["step"] >= 5 for r in _steps(workdir)))
            job.send_signal(signal.SIGTERM)
            job.wait(120)
            preempted = json.loads((workdir / "run" / "preempted.json").read_text())
            seconds.append(preempted["sigterm_to_commit_s"])
    mb = _state_mb(load_task("classifier", **BIG_MODEL))
    return [(f"SIGTERM -> committed emergency checkpoint, {mb:.0f} MB, 2 ranks",
             f"runs: {', '.join(f'{s:.2f}' for s in seconds)} s", f"{statistics.median(seconds):.2f} s", "<= 5 s")]


BENCHES = {"throughput": bench_throughput, "checkpoint": bench_checkpoint, "sigkill": bench_sigkill, "sigterm": bench_sigterm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), default=list(BENCHES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="seconds, not minutes: a small model, one repeat (CI runs this)")
    args = parser.parse_args()
    if args.quick:
        quick()
        args.repeats = 1
    table = Table(title=f"trainforge runtime benchmarks (median of {args.repeats})", title_justify="left")
    for column in ("measurement", "detail", "result", "goal"):
        table.add_column(column)
    for name in args.only:
        with console.status(f"running {name} ..."):
            for row in BENCHES[name](args.repeats):
                table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
