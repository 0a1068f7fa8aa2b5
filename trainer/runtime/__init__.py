"""The runtime inside every worker. Entry: `python -m trainforge.trainer.runtime` (under torchrun)."""
