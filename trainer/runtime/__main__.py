"""Worker entry point: `torchrun --nproc_per_node=N -m trainforge.trainer.runtime run.yaml [--set key=value ...]`.

Exit codes (trainforge.contract): 0 done, 2 user error (not retried), 143 preempted (resume me).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from trainforge import exits, paths
from trainforge import errors


def parse_overrides(pairs: list[str]) -> dict:
    """`a.b=3` -> {"a": {"b": 3}}; values are YAML scalars (numbers, booleans, null, strings)."""
    out: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set {pair!r}: expected key=value")
        key, value = pair.split("=", 1)
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    return out


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainforge.trainer.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, help="run config (YAML or JSON)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s rank{rank} %(levelname)s %(message)s")
    log = logging.getLogger("trainforge.runtime")

    from trainforge.trainer.runtime.config import RunConfig, UserError

    try:
        raw = yaml.safe_load(args.config.read_text()) if args.config else {}
        cfg = RunConfig.model_validate(merge(raw or {}, parse_overrides(args.overrides)))
    except ValidationError as exc:
        raise UserError("run config " + "; ".join(errors.problems(exc))) from None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise UserError(f"invalid run config: {exc}") from None

    # Imported after validation: a config typo should not wait for torch to load.
    from trainforge.trainer.runtime.api import train
    from trainforge.trainer.runtime.tasks import load_task

    # A sweep trial: rank 0 reports each evaluation to the study and asks its pruner (runtime/pruning.py).
    reporter = None
    if cfg.sweep is not None and rank == 0:
        from trainforge.trainer.runtime.pruning import TrialReporter
        reporter = TrialReporter(cfg.sweep)
    result = train(load_task(cfg.task, **cfg.task_args), cfg, eval_hooks=(reporter,) if reporter else ())
    if rank == 0:
        log.info("finished: %s", json.dumps(result.__dict__))
        Path(cfg.output_dir, paths.RESULT_FILE).write_text(json.dumps(result.__dict__))
    if reporter is not None:
        told = reporter.finish(result.exit_code, result.stopped_because, result.last_eval)
        if told and cfg.sweep is not None:
            log.info("sweep trial %d: %s", cfg.sweep.trial_id, told)
    import torch.distributed as dist
    if result.exit_code == exits.EXIT_OK and dist.is_initialized():  # train() destroys the group it made
        dist.destroy_process_group()
    return result.exit_code


# What gloo's TCP transport says when the rank at the other end of a collective is gone, e.g. "[.../gloo/transport/
# tcp/pair.cc:537] Read error [...]: Connection reset by peer". NCCL raises DistBackendError, or its watchdog aborts
# the process, which leaves no record and reads as a lost worker. Only gloo's own messages count: a user's code
# that hits "connection reset" on its own socket is still the user's error.
# A peer that vanished without resetting its connections (a node lost with its network, a frozen host) shows up as
# gloo's timeout instead, e.g. "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 600000ms for recv
# operation to complete": a retry, as NCCL's timeout is (its watchdog aborts the process, which reads as a lost worker).
PEER_FAILURE_MESSAGES = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Timed out waiting")


def is_peer_failure(exc: BaseException) -> bool:
    from trainforge.trainer.runtime.config import PeerLost

    dist = sys.modules.get("torch.distributed")
    if isinstance(exc, PeerLost) or (dist is not None and isinstance(exc, getattr(dist, "DistError", ()))):
        return True
    message = str(exc)
    return isinstance(exc, RuntimeError) and "gloo" in message and any(m in message for m in PEER_FAILURE_MESSAGES)


# CUDA errors that are the hardware's or the node's, never the job's code (cudaError_t, CUDA runtime driver_types.h,
# with cudaGetErrorString's words as torch prints them after "CUDA error: "). Errors a job's own kernels can cause
# (an illegal address, a device-side assert, a launch failure) stay the job's: retrying them would only loop.
DEVICE_FAULT_CUDA_ERRORS = {
    46: "CUDA-capable device(s) is/are busy or unavailable",
    100: "no CUDA-capable device is detected",
    214: "uncorrectable ECC error encountered",
    220: "uncorrectable NVLink error detected during the execution",
    802: "system not yet initialized",  # an HGX node's fabric manager is not running
    999: "unknown error",  # what a GPU that fell off the bus (Xid 79) gives
}


def is_device_fault(exc: BaseException) -> bool:
    """The GPU failed: a DeviceFault of ours, or a CUDA error of the hardware's kind (by torch.AcceleratorError's
    error_code where torch set it, else by its words)."""
    from trainforge.trainer.runtime.config import DeviceFault

    if isinstance(exc, DeviceFault):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    code = getattr(exc, "error_code", None)
    if code is not None:
        return code in DEVICE_FAULT_CUDA_ERRORS
    message = str(exc)
    return any(f"CUDA error: {words}" in message for words in DEVICE_FAULT_CUDA_ERRORS.values())


def exit_code_for(exc: BaseException) -> int:
    """An uncaught exception is a bug in the job (1, not retried), unless a peer's loss or the GPU's failure caused it
    (retried)."""
    from trainforge.trainer.runtime.config import UserError

    if isinstance(exc, SystemExit):
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    if isinstance(exc, UserError):
        return exc.exit_code
    if is_device_fault(exc):
        return exits.EXIT_DEVICE_FAULT
    return exits.EXIT_PEER_LOST if is_peer_failure(exc) else 1


def failure_message(exc: BaseException) -> str:
    """One line for the researcher: what the job's own code (or config) raised."""
    from trainforge.trainer.runtime.config import UserError

    if isinstance(exc, UserError):
        return str(exc).replace("\n", " ")
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def entry() -> int:
    from trainforge.exits import record_exit
    from trainforge.trainer.runtime.config import UserError

    try:
        code = main()
    except BaseException as exc:
        code = exit_code_for(exc)
        record_exit(code, failure_message(exc) if 0 < code < 128 else "")
        if isinstance(exc, UserError):
            logging.getLogger("trainforge.runtime").error("%s", exc)
            return code
        said = (str(exc).splitlines() or [type(exc).__name__])[0][:500]
        if code == exits.EXIT_PEER_LOST:
            logging.getLogger("trainforge.runtime").error("a collective failed because a peer is gone (%s); exiting %d to be "
                                                          "restarted from the last checkpoint", said, code)
            return code
        if code == exits.EXIT_DEVICE_FAULT:
            logging.getLogger("trainforge.runtime").error("the GPU failed (%s); exiting %d to be restarted from the last "
                                                          "checkpoint", said, code)
            return code
        raise
    record_exit(code)
    return code


if __name__ == "__main__":
    raise SystemExit(entry())
