"""The runtime inside every worker. Entry: `python -m trainforge.trainer.runtime` (under torchrun), or `train()`."""

from trainforge.trainer.runtime.api import train
from trainforge.trainer.runtime.config import RunConfig
from trainforge.trainer.runtime.tasks import Task

__all__ = ["RunConfig", "Task", "train"]
