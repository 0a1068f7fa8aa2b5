"""torchrun as the warm worker interpreter forks it: imported by that interpreter (launch.WORKER_MODULES), never by a
cold torchrun or a pod's.

torch's elastic rendezvous names the method behind each record it keeps with `inspect.stack()`, twice per record
(torch/distributed/elastic/rendezvous/dynamic_rendezvous.get_method_name). `inspect.stack()` finds every frame's
source file, and for a frame of a frozen module (runpy's: `python -m` and the fork server both run through it)
`inspect.getmodule` walks the whole of sys.modules again each time. The warm interpreter holds about 4,000 modules
(optuna, SQLAlchemy, MLflow with pandas, preloaded for trials), and a forked torchrun spent about 1.4 s of CPU per
two-rank job naming its rendezvous steps (py-spy over tests/test_runtime.py: 41 s of 270). The name is the code name of
the frame `depth` levels up, which `sys._getframe` gives without reading any source.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

_TORCHS = dynamic_rendezvous.get_method_name


def method_name(depth: int = 2) -> str:
    """What torch's get_method_name returns (`inspect.stack()[depth].function`: index 0 is this function's own frame)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


dynamic_rendezvous.get_method_name = method_name
