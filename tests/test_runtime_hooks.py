"""Stop rules are on_eval hooks: rank 0 decides, the decision rides the step's collective, every rank stops at the
same step; a stateful hook is checkpointed and restored."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.repo import REPO

from trainforge.trainer.runtime import hooks


def test_early_stopping_counts_evaluations_without_improvement_and_survives_a_round_trip():
    rule = hooks.EarlyStopping("loss", "min", patience=2)
    assert [rule.on_eval(s, {"loss": v}) for s, v in enumerate([1.0, 0.9, 0.95, 0.91])] == [None, None, None, "early_stopping"]
    restored = hooks.EarlyStopping("loss", "min", patience=2)
    restored.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert (restored.best, restored.evals_without_improvement) == (0.9, 2)


def test_target_metric_respects_the_direction():
    assert hooks.TargetMetric("accuracy", "max", 0.9).on_eval(1, {"accuracy": 0.91}) == "target_metric"
    assert hooks.TargetMetric("loss", "min", 0.5).on_eval(1, {"loss": 0.6}) is None


def test_every_hook_sees_every_evaluation_and_the_first_reason_wins():
    patience = hooks.EarlyStopping("loss", "min", patience=1, best=0.1)
    target = hooks.TargetMetric("loss", "min", 0.5)
    assert hooks.first_stop([target, patience], 3, {"loss": 0.4}) == "target_metric"
    assert patience.evals_without_improvement == 1, "the second hook still counted the evaluation"


def test_stop_reasons_travel_as_codes_and_unknown_ones_are_refused():
    assert [hooks.reason_of(hooks.reason_code(r)) for r in (None, *hooks.STOP_REASONS)] == [None, *hooks.STOP_REASONS]
    with pytest.raises(ValueError, match="STOP_REASONS"):
        hooks.reason_code("bored")


RANK0_PRUNES = """
import json, os, sys
from trainforge.trainer.runtime import RunConfig, train
from trainforge.trainer.runtime.tasks import classifier

class PruneAt:
    name = "pruner"
    def on_eval(self, step, metrics):
        # Only rank 0 runs hooks: a hook that would decide differently elsewhere cannot split the ranks.
        assert os.environ["RANK"] == "0", "hooks run on rank 0 only"
        return "pruned" if step >= 30 else None

out = sys.argv[1]
cfg = RunConfig(max_steps=200, eval_every=10, checkpoint={"dir": out + "/ckpt", "interval_steps": 1000}, output_dir=out + "/run")
result = train(classifier(), cfg, eval_hooks=(PruneAt(),))
with open(f"{out}/rank{os.environ['RANK']}.json", "w") as f:
    json.dump({"step": result.step, "why": result.stopped_because}, f)
"""


@pytest.mark.slow
def test_rank_zeros_decision_stops_every_rank_at_the_same_step(tmp_path):
    script = tmp_path / "prune.py"
    script.write_text(RANK0_PRUNES)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script), str(tmp_path)],
                            capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert outcomes == [{"step": 30, "why": "pruned"}] * 2
