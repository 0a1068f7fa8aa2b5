"""GPU benchmark of the runtime's hot loop: tokens/s and model FLOPs utilisation (MFU, against the GPU's dense bf16
peak) of the bundled transformer (char_lm at ~0.8 B parameters through its task arguments), on one GPU:

  - a plain hand-written bf16 loop vs the runtime's loop (same model, batch, optimizer), DDP-path vs FSDP, with and
    without torch.compile;
  - async checkpoint blocking time (pinned-memory staging) vs a synchronous save of the same state.

Ratios are measured in one run, medians over 10-step windows after warm-up. A benchmark, never a pass/fail test.

    python benchmarks/bench_gpu.py                  # on a GPU machine
    python benchmarks/bench_gpu.py --dry-run        # a tiny model on CPU: checks the script runs (no MFU)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from bench_runtime import LOG_EVERY, windowed_rate
from rich.console import Console
from rich.table import Table

BIG = {"context": 1024, "dim": 2048, "layers": 16, "heads": 16}  # ~0.8 B parameters
TINY = {"context": 64, "dim": 64, "layers": 2, "heads": 2}


def peak_flops(override: float | None) -> float | None:
    import torch
    if override:
        return override * 1e12
    if not torch.cuda.is_available():
        return None
    from trainforge import catalog
    return catalog.peak_bf16_flops(torch.cuda.get_device_name())  # per SKU, the runtime's MFU gauge uses the same


def flops_per_token(params: int, layers: int, dim: int, context: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus causal attention's scores and values."""
    return 6 * params + 6 * layers * dim * context


def plain_tokens_per_s(task, batch: int, steps: int, warmup: int, compile_model: bool) -> float:
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = task.build_model().to(device)
    if compile_model:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    loader = torch.utils.data.DataLoader(task.train_set, batch_size=batch, shuffle=True, drop_last=True)
    batches, logged_steps, logged_at, tokens = iter(loader), [], [], 0
    for step in range(1, steps + 1):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, counts = task.loss(model, (x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens = counts["tokens"]
        if step % LOG_EVERY == 0:
            loss.item()
            logged_steps.append(step)
            logged_at.append(time.perf_counter())
    return windowed_rate(logged_steps, logged_at, warmup) * tokens


def runtime_tokens_per_s(task_args: dict, batch: int, steps: int, warmup: int, strategy: str, compile_model: bool, env, guard) -> float:
    import json
    from pathlib import Path

    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.runtime.loop import Trainer
    from trainforge.trainer.runtime.tasks import load_task
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.model_validate({"task": "char_lm", "task_args": task_args, "max_steps": steps, "batch_size": batch,
                                        "precision": "bf16", "strategy": strategy, "compile": compile_model,
                                        "eval_every": 10_000, "eval_batches": 1, "log_every": LOG_EVERY, "warmup_steps": 5,
                                        "output_dir": f"{tmp}/run", "checkpoint": {"dir": f"{tmp}/ckpt", "interval_steps": 10_000}})
        Trainer(load_task("char_lm", **task_args), cfg, env).run(guard)
        records = sorted((r["step"], r["t"]) for r in map(json.loads, (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()) if "loss" in r)
    return windowed_rate([s for s, _ in records], [t for _, t in records], warmup) * batch * task_args["context"]


def checkpoint_blocking(task, env) -> tuple[float, float, float]:
    """(seconds training was blocked by an async save with pinned staging, by a sync save, state size in GB)."""
    import torch

    from trainforge.trainer.runtime.checkpoint import CheckpointManager
    from trainforge.trainer.runtime.config import CheckpointConfig
    model = task.build_model().to(env.device)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long, device=env.device)).sum().backward()
    optimizer.step()  # materialise the optimizer's state
    size = sum(p.numel() for p in model.parameters()) * 4 * 3 / 1e9
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("async", "sync"):
            manager = CheckpointManager(CheckpointConfig(dir=f"{tmp}/{mode}", async_save=mode == "async"), rank=0, world_size=1,
                                        metric_mode="min", process_group=env.checkpoint_group)
            blocked = [manager.save(step, model, optimizer, {}, None, blocking=False) + manager.wait_for_staging() for step in (1, 2, 3)]
            manager.close()
            results[mode] = statistics.median(blocked[1:])  # the first async save also builds the staging buffers
    return results["async"], results["sync"], size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on CPU: checks the script, measures nothing useful")
    parser.add_argument("--quick", action="store_true", help="--dry-run with few steps (CI runs this; no GPU needed)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in the table")
    args = parser.parse_args()
    if args.quick:
        args.dry_run = True

    import torch

    from trainforge.trainer.runtime.distributed import init_distributed
    from trainforge.trainer.runtime.preemption import PreemptionGuard
    from trainforge.trainer.runtime.tasks import load_task
    if not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("no GPU here: run on a GPU machine, or --dry-run to check the script on CPU")
    task_args = TINY if args.dry_run else BIG
    steps, warmup = (30, 10) if args.dry_run else (args.steps, 20)
    env, guard = init_distributed(), PreemptionGuard(30)
    task = load_task("char_lm", **task_args)
    params = sum(p.numel() for p in task.build_model().parameters())
    per_token = flops_per_token(params, task_args["layers"], task_args["dim"], task_args["context"])
    peak = peak_flops(args.peak_tflops)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    table = Table(title=f"char_lm {params / 1e9:.2f} B parameters, bf16, batch {args.batch} x {task_args['context']} tokens on {device}",
                  title_justify="left")
    for column in ("loop", "compile", "tokens/s", "MFU", "vs plain"):
        table.add_column(column, justify="left" if column in ("loop", "compile") else "right")
    for compile_model in (False, True):
        if compile_model and args.dry_run:
            continue  # compiling on CPU takes minutes and measures nothing
        plain = plain_tokens_per_s(task, args.batch, steps, warmup, compile_model)
        rows = [("plain", plain)] + [(f"runtime ({strategy})", runtime_tokens_per_s(task_args, args.batch, steps, warmup, strategy, compile_model, env, guard))
                                     for strategy in ("ddp", "fsdp")]
        for label, rate in rows:
            mfu = f"{rate * per_token / peak:.1%}" if peak else "-"
            table.add_row(label, "yes" if compile_model else "no", f"{rate:,.0f}", mfu, f"{rate / plain:.3f}")
    async_s, sync_s, size = checkpoint_blocking(task, env)
    console = Console(width=140)
    console.print(table)
    console.print(f"checkpoint of {size:.2f} GB (weights + AdamW): training blocked {async_s * 1000:.0f} ms by an async save "
                  f"(pinned staging: {torch.cuda.is_available()}) vs {sync_s * 1000:.0f} ms by a sync save ({sync_s / max(async_s, 1e-9):.1f}x)")


if __name__ == "__main__":
    main()
