"""`precision: auto` follows what the device computes natively, an explicit bf16 that would be emulated says what it
costs, a checkpoint resumes under another precision, and train() runs twice in one process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from support.lanes import ITSELF, TIMING, full

torch = pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")

from support.training import result, run  # noqa: E402

from trainforge.trainer.runtime import precision  # noqa: E402

pytestmark = pytest.mark.slow
NO_NATIVE_BF16 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # ../shared/MACHINE-NOTES.md


def resolved_in_a_process(requested: str, env: dict[str, str]) -> dict:
    code = textwrap.dedent(f"""
        import json, torch
        from trainforge.trainer.runtime import precision
        chosen = precision.resolve({requested!r}, torch.device("cpu"))
        print(json.dumps({{"chosen": chosen.chosen, "reason": chosen.reason, "slowdown": precision.cpu_bf16_slowdown()}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_auto_never_picks_bf16_where_the_cpu_would_emulate_it():
    decided = resolved_in_a_process("auto", NO_NATIVE_BF16)
    assert decided["slowdown"] > precision.NATIVE_BF16_MAX_SLOWDOWN, "the variables make bf16 emulated on any x86 CPU"
    assert decided["chosen"] == "fp32" and "emulated" in decided["reason"], decided


@TIMING
def test_auto_on_this_machine_follows_the_measured_cost_of_bf16():
    decided = resolved_in_a_process("auto", {})
    native = decided["slowdown"] <= precision.NATIVE_BF16_MAX_SLOWDOWN
    assert decided["chosen"] == ("bf16" if native else "fp32"), decided


@pytest.mark.parametrize("device,native,chosen", [("cpu", True, "bf16"), ("cpu", False, "fp32"), ("cuda", True, "bf16"),
                                                  ("cuda", False, "fp16")])
def test_auto_takes_bf16_where_native_and_else_the_fastest_safe_choice(device, native, chosen):
    assert precision.resolve("auto", torch.device(device), (native, "measured")).chosen == chosen


def test_an_explicit_bf16_that_would_be_emulated_is_kept_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="trainforge.runtime"):
        decided = precision.resolve("bf16", torch.device("cpu"), (False, "a bf16 matmul takes 17.0x fp32's"))
    assert decided.chosen == "bf16"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "emulated" in warning and "17.0x" in warning and "precision: auto" in warning
    assert precision.resolve("fp32", torch.device("cpu")).chosen == "fp32"


@pytest.mark.parametrize("first,then", [pytest.param("fp32", "bf16", marks=full("the other direction of the same resume", kept_by=ITSELF)),
                                         ("bf16", "fp32")])
def test_a_checkpoint_resumes_under_another_precision(tmp_path, first, then):
    """Checkpoints hold fp32 master weights and optimizer state whatever the run computed in."""
    run(tmp_path, f"precision={first}", "max_steps=30", nproc=None)
    assert result(tmp_path)["precision"] == first
    run(tmp_path, f"precision={then}", "max_steps=40", nproc=None)
    resumed = result(tmp_path)
    assert resumed["resumed_from"] == 30 and resumed["step"] == 40 and resumed["precision"] == then
    assert resumed["last_eval"]["accuracy"] > 0.5, resumed


TWICE = """
import json, sys
from trainforge.trainer.runtime import RunConfig, train
from trainforge.trainer.runtime.tasks import load_task
out = []
for attempt in ("a", "b"):
    cfg = RunConfig(job_id=f"twice-{attempt}", task="classifier", max_steps=20, warmup_steps=5, eval_every=10, precision="auto",
                    output_dir=f"{sys.argv[1]}/{attempt}/run", checkpoint={"dir": f"{sys.argv[1]}/{attempt}/ckpt"})
    out.append(train(load_task("classifier"), cfg).step)
print(json.dumps(out))
"""


def test_train_runs_twice_in_one_process(tmp_path):
    """A notebook or an in-process trial calls train() again: the first call leaves no process group behind."""
    done = subprocess.run([sys.executable, "-c", TWICE, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [20, 20]
