"""The hot loop reads nothing from the device between log steps: the loss stays on the device until a log step, and
the only per-step read is the stop agreement, a two-integer tensor on the host."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.lanes import ITSELF, full
from support.repo import REPO

COUNT_READS = r"""
import collections, json, sys
import torch
import trainforge.trainer.runtime.loop as loop
import trainforge.trainer.runtime.stop_agreement as stop_agreement
from trainforge.trainer.runtime import RunConfig, train
from trainforge.trainer.runtime.tasks import load_task

reads = collections.Counter()
for name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__"):
    original = getattr(torch.Tensor, name)
    def counted(self, *args, __name=name, __original=original, **kwargs):
        caller = sys._getframe(1).f_code
        if caller.co_filename in (loop.__file__, stop_agreement.__file__):  # the loop and its per-step agreement
            reads[f"{caller.co_name} {__name} {self.device.type} {self.dtype}"] += 1
        return __original(self, *args, **kwargs)
    setattr(torch.Tensor, name, counted)

out = sys.argv[1]
cfg = RunConfig(task=sys.argv[2], max_steps=40, log_every=10, eval_every=1000, grad_accum_steps=2, batch_size=16,
                checkpoint={"dir": out + "/ckpt", "interval_steps": 1000}, output_dir=out + "/run")
train(load_task(sys.argv[2]), cfg)
print(json.dumps(reads))
"""


@pytest.mark.slow
@pytest.mark.parametrize("task", ["classifier", pytest.param("char_lm", marks=full("the same loop over the other bundled task", kept_by=ITSELF))])
def test_the_loop_reads_the_device_only_at_log_steps(tmp_path, task):
    result = subprocess.run([sys.executable, "-c", COUNT_READS, str(tmp_path), task], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    reads = json.loads(result.stdout.strip().splitlines()[-1])
    per_step = {k: n for k, n in reads.items() if not k.startswith(("_log_step ", "evaluate "))}
    # The agreement: one host read per step, of a host int64 tensor (it never waits on the GPU).
    assert per_step == {"land tolist cpu torch.int64": 40}, per_step
    # The loss: read once per log step (10, 20, 30, 40), however many micro-batches each step has.
    assert reads["_log_step item cpu torch.float32"] == 4
    # The final evaluation reads its reduced sums once.
    assert reads.get("evaluate tolist cpu torch.float32") == 1


@pytest.mark.slow
@full("a benchmark script's dry run: benchmarks run in the full lane")
def test_the_gpu_benchmark_script_runs_as_is():
    """No GPU in CI: its --dry-run takes the same code paths on a tiny model on CPU, so the script stays ready."""
    result = subprocess.run([sys.executable, "bench_gpu.py", "--dry-run"], capture_output=True, text=True, cwd=REPO / "benchmarks", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runtime (fsdp)" in result.stdout and "checkpoint of" in result.stdout


def test_the_bundled_transformer_reaches_benchmark_size_through_its_arguments():
    from trainforge.trainer.runtime.tasks import TinyTransformerLM
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_gpu import BIG
    model = TinyTransformerLM(96, BIG["context"], dim=BIG["dim"], layers=BIG["layers"], heads=BIG["heads"])
    params = sum(p.numel() for p in model.parameters())
    assert 0.5e9 <= params <= 1.0e9, params
