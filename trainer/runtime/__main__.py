"""Worker entry point: `torchrun --nproc_per_node=N -m trainforge.trainer.runtime run.yaml [--set key=value ...]`.

Exit codes (trainforge.exits): 0 done, 1 the job's own bug and 2 a user error (neither retried), 143 preempted (resume
me), 200 a peer lost and 202 the GPU failed (retried: the node launcher exits 137 for them).
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
# operation to complete": a retry, as NCCL's timeout is (its watchdog aborts the process). The price, as with NCCL's:
# ranks that wait on each other for good (a collective only some of them call) are retried until the job's restarts
# run out, a gloo timeout each. A host gone from the network: TCP gives up first ("Connection timed out", "No route to
# host"). After a timeout gloo closes the pair, and the group's next operation says only "Application timeout caused
# pair closure".
PEER_FAILURE_MESSAGES = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Timed out waiting",
                         "Connection timed out", "No route to host")
GLOO_PAIR_CLOSED = "caused pair closure"
# NCCL's own verdicts on how it was called (torch's ProcessGroupNCCL error details): the job's collectives disagree (a
# size or a dtype across ranks, two ranks on one GPU). Retrying would meet the same disagreement.
NCCL_MISUSE = ("ncclInvalidUsage", "ncclInvalidArgument")


def is_peer_failure(exc: BaseException) -> bool:
    dist = sys.modules.get("torch.distributed")
    message = str(exc)
    if dist is not None and isinstance(exc, getattr(dist, "DistError", ())):
        return not any(m in message for m in NCCL_MISUSE)
    gloo = "gloo" in message and any(m in message for m in PEER_FAILURE_MESSAGES)
    return isinstance(exc, RuntimeError) and (gloo or GLOO_PAIR_CLOSED in message)


# CUDA errors that are, as a rule, the hardware's or the node's and not the job's code (cudaError_t, CUDA runtime
# driver_types.h, with cudaGetErrorString's words as torch prints them after "CUDA error: "). Errors a job's own
# kernels can cause (an illegal address, a device-side assert, a launch failure) stay the job's, though a failing GPU
# can also end in them: retrying a job's own bug would only loop.
DEVICE_FAULT_CUDA_ERRORS = {
    46: "CUDA-capable device(s) is/are busy or unavailable",
    100: "no CUDA-capable device is detected",
    214: "uncorrectable ECC error encountered",
    220: "uncorrectable NVLink error detected during the execution",
    802: "system not yet initialized",  # an HGX node's fabric manager is not running
    999: "unknown error",  # what a GPU that fell off the bus (Xid 79) may give
}


def is_device_fault(exc: BaseException) -> bool:
    """A CUDA error of the hardware's kind: by torch.AcceleratorError's error_code (torch sets it from CUDA's), else by
    CUDA's words (an error raised elsewhere, e.g. NCCL's)."""
    torch = sys.modules.get("torch")
    message = str(exc)
    if torch is not None and isinstance(exc, getattr(torch, "AcceleratorError", ())) and getattr(exc, "error_code", None) is not None:
        return "CUDA error" in message and exc.error_code in DEVICE_FAULT_CUDA_ERRORS  # type: ignore[attr-defined]
    return isinstance(exc, RuntimeError) and any(f"CUDA error: {words}" in message for words in DEVICE_FAULT_CUDA_ERRORS.values())


def causes(exc: BaseException) -> list[BaseException]:
    """`exc`, what it was raised from or while handling, and what DCP's CheckpointException gathered from each rank: a
    GPU's or a peer's failure inside a checkpoint's save is still that failure."""
    found: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        todo += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):  # torch.distributed.checkpoint.api.CheckpointException: {rank: (exception, trace)}
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return found


def own_exit_code(exc: BaseException) -> int | None:
    """The code one of our errors carries (a UserError of a task's own included), None for anything else."""
    from trainforge.trainer.runtime.config import UserError

    code = getattr(exc, "exit_code", None)
    ours = isinstance(exc, UserError) or type(exc).__module__.startswith("trainforge.")
    return code if ours and isinstance(code, int) else None


def exit_code_for(exc: BaseException) -> int:
    """An uncaught exception is a bug in the job (1, not retried), unless the GPU's failure or a peer's loss caused it
    (retried): our own errors say their code (UserError, PeerLost, DeviceFault, a sweep trial's ServicesDown), a
    library's is read for its cause."""
    from trainforge.trainer.runtime.config import DeviceFault, PeerLost

    if isinstance(exc, SystemExit):
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    code = own_exit_code(exc)
    if code is not None:
        return code
    chain = causes(exc)
    if any(isinstance(e, DeviceFault) or is_device_fault(e) for e in chain):
        return exits.EXIT_DEVICE_FAULT
    if any(isinstance(e, PeerLost) or is_peer_failure(e) for e in chain):
        return exits.EXIT_PEER_LOST
    return 1


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def failure_message(exc: BaseException) -> str:
    """One line for the researcher: what the job's own code (or config) raised."""
    from trainforge.trainer.runtime.config import UserError

    if isinstance(exc, UserError):
        return str(exc).replace("\n", " ")
    first = first_line(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# What each retryable end is, for the one line a worker logs as it exits with it.
RETRY_REASONS = {exits.EXIT_PEER_LOST: "a peer is gone", exits.EXIT_DEVICE_FAULT: "the GPU failed",
                 exits.EXIT_SERVICES_DOWN: "a service it needs stayed down"}


def entry() -> int:
    from trainforge.exits import record_exit

    try:
        code = main()
    except BaseException as exc:
        code = exit_code_for(exc)
        record_exit(code, failure_message(exc) if 0 < code < 128 else "")
        ours = own_exit_code(exc) is not None  # a UserError, PeerLost, DeviceFault, ServicesDown...
        # Our own errors say it all in one line; a library's first line is the gist (gloo's go on for a while).
        said = str(exc) if ours else first_line(exc)[:300] or type(exc).__name__
        if code in RETRY_REASONS:
            logging.getLogger("trainforge.runtime").error("%s (%s); exiting %d to be restarted from the last checkpoint",
                                                          RETRY_REASONS[code], said, code)
            return code
        if ours:  # the process exits with the code its record says
            logging.getLogger("trainforge.runtime").error("%s", said)
            return code
        raise
    record_exit(code)
    return code


if __name__ == "__main__":
    raise SystemExit(entry())
