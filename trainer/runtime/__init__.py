"""The runtime inside every worker. Entry: `python -m trainforge.trainer.runtime` (under torchrun), or `train()`.

`RunConfig` (runtime/config.py) imports no torch, so the CLI validates a job's run config before anything starts;
`train` and `Task` load torch on first use.
"""

from trainforge.trainer.runtime.config import RunConfig

__all__ = ["RunConfig", "Task", "train"]


def __getattr__(name: str):
    if name == "train":
        from trainforge.trainer.runtime.api import train
        return train
    if name == "Task":
        from trainforge.trainer.runtime.tasks import Task
        return Task
    raise AttributeError(f"module 'trainforge.trainer.runtime' has no attribute {name!r}")
