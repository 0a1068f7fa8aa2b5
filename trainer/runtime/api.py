"""The researcher's Python API: train your own Task with a RunConfig, alone or under torchrun.

    from trainforge.trainer.runtime import RunConfig, Task, train
    result = train(my_task(), RunConfig(max_steps=1000, strategy="fsdp"))
"""

from __future__ import annotations

import os
from pathlib import Path

from trainforge import exits, paths
from trainforge.files import write_whole
from trainforge.trainer.runtime.config import RunConfig
from trainforge.trainer.runtime.hooks import EvalHook
from trainforge.trainer.runtime.distributed import init_distributed, leave_distributed
from trainforge.trainer.runtime.loop import RunResult, Trainer
from trainforge.trainer.runtime.preemption import PreemptionGuard
from trainforge.trainer.runtime.tasks import Task

STATUS = {exits.EXIT_OK: "FINISHED", exits.EXIT_PREEMPTED: "KILLED"}


def train(task: Task, cfg: RunConfig, guard: PreemptionGuard | None = None, eval_hooks: tuple[EvalHook, ...] = ()) -> RunResult:
    """Run `task` to completion, preemption or a stop rule. Call it from the main thread of every worker.

    `eval_hooks` run after every evaluation on rank 0, after the run config's own stop rules (a sweep's pruner is one)."""
    guard = guard or PreemptionGuard(cfg.checkpoint.preemption_grace_s)
    pids = Path(cfg.output_dir, paths.PIDS_DIR)
    pids.mkdir(parents=True, exist_ok=True)
    write_whole(pids / f"rank{os.environ.get('RANK', '0')}.pid", str(os.getpid()))  # read by whoever signals the workers
    env, result = None, None
    try:
        env = init_distributed(cfg.nccl, str(cfg.output_dir))
        trainer = Trainer(task, cfg, env)
        for hook in eval_hooks:
            trainer.add_eval_hook(hook)
        result = trainer.run(guard)
        trainer.close(STATUS.get(result.exit_code, "FAILED"))
        return result
    finally:
        guard.done()
        if env is not None:  # so train() can be called again in this process
            leave_distributed(env, clean=result is not None and result.exit_code == exits.EXIT_OK)
