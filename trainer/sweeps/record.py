"""Where a sweep started from this machine lives: `$TRAINFORGE_HOME/sweeps/<name>/sweep.json`, one typed record.

`trainforge sweep SPEC` writes it when it starts a sweep (on this machine: with its study's storage; in the cluster:
with the controller's team, context and kind), so that every later command (`status`, `best`, `cancel`, `resume`,
`extend`) finds the sweep by its name alone. A file written by an earlier version reads the same (its keys are these
fields); a key this version does not know is ignored, one it does not find takes its default.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Final, Optional

from trainforge import paths
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.files import write_whole
from trainforge.trainer.backends import KUBERNETES, LOCAL

RECORD_FILE = "sweep.json"
TRAINJOB: Final = "trainjob"


@dataclass(frozen=True)
class SweepRecord:
    backend: str = LOCAL  # where the controller runs: this machine, or the team's namespace
    kind: str = TRAINJOB  # the job kind of its trials (and, in the cluster, of its controller)
    team: Optional[str] = None
    context: Optional[str] = None  # the kubeconfig context it was started with
    source: Optional[str] = None  # the sweep spec it was started from (absolute): what `resume` runs again
    stack: Optional[str] = None  # the stack file it was admitted against
    storage: Optional[str] = None  # the study's database URL (a sweep on this machine)

    @property
    def started_here(self) -> bool:
        return self.source is not None

    @property
    def in_cluster(self) -> bool:
        return self.backend == KUBERNETES

    @classmethod
    def load(cls, name: str) -> SweepRecord:
        """The record of sweep `name`; an empty one (`started_here` False) where this machine started none."""
        path = paths.sweep_dir(name) / RECORD_FILE
        if not path.exists():
            return cls()
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw, dict):
                raise TypeError(f"a JSON object was expected, not {type(raw).__name__}")
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in raw.items() if k in known and v is not None})
        except (ValueError, TypeError) as exc:
            raise TrainforgeError("", [f"{path}: the sweep's record is damaged ({exc}). Fix: start the sweep again from its "
                                       "spec (`trainforge sweep SPEC.yaml --resume`), which writes it anew"], exit_code=EXIT_FAILED) from None

    def save(self, name: str) -> None:
        """Atomically: a command reading it meanwhile sees the old record or the new one, never half of one."""
        directory = paths.sweep_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        write_whole(directory / RECORD_FILE, json.dumps(dataclasses.asdict(self), indent=2))
