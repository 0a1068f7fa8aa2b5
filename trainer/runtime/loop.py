"""The training loop: one code path for one process or many, DDP or FSDP2, CPU (gloo) or CUDA (NCCL)."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainforge import contract, paths
from trainforge.trainer.runtime import build, hooks, precision
from trainforge.trainer.runtime.checkpoint import CheckpointManager, start_from
from trainforge.trainer.runtime.config import RunConfig, UserError
from trainforge.trainer.runtime.data import ResumableDistributedSampler, micro_batches
from trainforge.trainer.runtime.metrics import RuntimeMetrics
from trainforge.trainer.runtime.preemption import PreemptionGuard
from trainforge.trainer.runtime.tasks import Task, data_checksum

log = logging.getLogger("trainforge.runtime")


@dataclass
class Distributed:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    checkpoint_group: dist.ProcessGroup  # gloo: checkpoint collectives, some from DCP's background thread
    control_group: dist.ProcessGroup  # gloo: the per-step stop agreement, a host-side collective that never waits on the GPU
    owns_group: bool = True  # init_distributed made the default group (a caller's own group is left to the caller)
    lone: bool = False  # no torchrun: init_distributed set RANK, WORLD_SIZE... itself

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LONE_PROCESS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def init_distributed() -> Distributed:
    """Join the job's process group; a lone process (no torchrun) forms a group of one, so nothing branches. A default
    group the caller already made is used as it is."""
    lone = "RANK" not in os.environ
    if lone:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    checkpoint_group = dist.new_group(backend="gloo")
    control_group = dist.new_group(backend="gloo")
    return Distributed(rank, world, local, device, checkpoint_group, control_group, owns_group, lone)


def leave_distributed(env: Distributed, *, clean: bool) -> None:
    """Undo init_distributed, so the process can train again (a notebook, in-process trials). The group is destroyed
    when the run ended cleanly or the process is alone; after a failure across ranks a peer may be gone, and
    destroying would wait on it, so the process's exit does it."""
    if env.owns_group and dist.is_initialized() and (clean or env.world_size == 1):
        dist.destroy_process_group()
    elif not env.owns_group:
        for group in (env.checkpoint_group, env.control_group):
            dist.destroy_process_group(group)
    if env.lone and not dist.is_initialized():
        for name in LONE_PROCESS_ENV:
            os.environ.pop(name, None)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def autocast(cfg: RunConfig, env: Distributed):
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(env.device.type, dtype=dtype)


@dataclass
class TrainerState:
    step: int = 0
    last_eval: dict[str, float] = field(default_factory=dict)
    restarts: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "last_eval": dict(self.last_eval), "restarts": self.restarts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.last_eval, self.restarts = state["step"], dict(state["last_eval"]), state["restarts"]


@dataclass
class _Agreement:
    values: torch.Tensor  # int64 [told to stop, rank 0's stop code], on the host
    work: Any  # the async collective's handle


class _Done:
    """The handle of a collective that had nothing to wait for."""

    def wait(self) -> bool:
        return True


_DONE = _Done()


@dataclass
class _LogInterval:
    """Host-side bookkeeping between two log steps: nothing here reads the device."""
    started_at: float
    first_step: int
    data_wait_s: float = 0.0


@dataclass(frozen=True)
class Agreement:
    """What every rank learns from a step's collective: whether any rank was told to stop, and rank 0's decision."""

    preempted: bool = False
    stop_reason: str | None = None


@dataclass
class RunResult:
    exit_code: int
    step: int
    last_eval: dict[str, float]
    resumed_from: int | None
    stopped_because: str
    precision: str = "fp32"  # what the run computed in
    precision_reason: str = ""


def resolve_metric(cfg: RunConfig, task: Task) -> RunConfig:
    """Fill in the task's default metric and mode; refuse a metric the task does not report."""
    name, mode = task.default_metric
    metric = cfg.metric or name
    if metric not in task.metrics:
        raise UserError(f"metric: task {task.name!r} reports {list(task.metrics)}, not {metric!r}. Fix: pick one of those")
    if cfg.metric_mode is None and metric != name:
        raise UserError(f"metric_mode: say whether {metric!r} is better when higher (max) or lower (min)")
    return cfg.model_copy(update={"metric": metric, "metric_mode": cfg.metric_mode or mode})


class Trainer:
    def __init__(self, task: Task, cfg: RunConfig, env: Distributed):
        probe = precision.agreed_probe(env.device, env.control_group) if cfg.precision in ("auto", "bf16") else None
        self.precision = precision.resolve(cfg.precision, env.device, probe)
        cfg = cfg.model_copy(update={"precision": self.precision.chosen})  # what is logged, tracked and run
        if env.is_main:
            log.info("precision: %s (%s)", self.precision.chosen, self.precision.reason)
        if cfg.precision == "fp16" and env.device.type != "cuda":
            raise UserError("precision: fp16 needs a CUDA device (its grad scaler exists for GPU underflow). Fix: use bf16 or fp32 on CPU")
        cfg = resolve_metric(cfg, task)
        self.task, self.cfg, self.env = task, cfg, env
        seed_everything(cfg.seed, cfg.deterministic)
        self.model = build.shard(task, task.build_model(), cfg, env)
        self.optimizer = build.optimizer_for(task, self.model, cfg)
        self.scheduler = build.scheduler_for(task, self.optimizer, cfg)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
        self.sampler = ResumableDistributedSampler(len(task.train_set), env.rank, env.world_size, cfg.seed)
        self.state = TrainerState()
        self._interval = _LogInterval(time.perf_counter(), 0)
        self.eval_hooks: list[hooks.EvalHook] = default_eval_hooks(cfg)
        self.checkpoints = CheckpointManager(cfg.checkpoint, rank=env.rank, world_size=env.world_size,
                                             metric_mode=cfg.metric_mode, process_group=env.checkpoint_group)
        self.output = Path(cfg.output_dir)
        self.output.mkdir(parents=True, exist_ok=True)
        self.metrics = RuntimeMetrics(job=cfg.job_id, team=cfg.team, rank=env.rank)
        if cfg.metrics.port is not None:
            self.metrics.serve(cfg.metrics.port + env.local_rank, cfg.metrics.addr)
        self.metrics.checkpoint_interval_steps.set(cfg.checkpoint.interval_steps)
        if env.local_rank == 0 and os.environ.get(contract.NODE_PRICE_ENV):
            self.metrics.node_price.set(float(os.environ[contract.NODE_PRICE_ENV]))
        self.checkpoints.on_commit.append(lambda c, seconds: self.metrics.checkpoint_committed(c.step, c.committed_at, seconds))
        self.s3 = self._durable_tier()
        self.tracker = self._tracker()

    def _precision_record(self) -> tuple[str, str]:
        return self.precision.chosen, self.precision.reason

    def _durable_tier(self):
        cfg, env = self.cfg.checkpoint, self.env
        if cfg.s3_uri is None or env.local_rank != 0:
            return None
        from trainforge.trainer.runtime.s3 import S3Tier
        tier = S3Tier(cfg.s3_uri, endpoint_url=cfg.s3_endpoint_url, max_concurrency=cfg.s3_max_concurrency, on_event=self.metrics.s3_event)
        if env.is_main:  # rank 0 uploads what every rank wrote to the shared local tier
            self.checkpoints.on_commit.append(lambda c, _: tier.enqueue(c))
            self.metrics.watch_s3_lag(tier.lag_seconds)
        return tier

    def _tracker(self):
        cfg, env = self.cfg, self.env
        if cfg.tracking.uri is None or not env.is_main:
            return None
        from trainforge.trainer.runtime.tracking import Tracker, flatten
        tags = {**({"mlflow.parentRunId": cfg.sweep.parent_run_id} if cfg.sweep and cfg.sweep.parent_run_id else {}),
                **({contract.TRACKING_SWEEP_TAG: cfg.sweep.study, "trainforge.trial_id": str(cfg.sweep.trial_id),
                    **({"trainforge.trial": str(cfg.sweep.trial_number)} if cfg.sweep.trial_number is not None else {})}
                   if cfg.sweep else {}),
                contract.TRACKING_TEAM_TAG: cfg.team, "trainforge.world_size": str(env.world_size), "trainforge.task": self.task.name,
                "trainforge.precision": f"{self.precision.chosen} ({self.precision.reason})",
                "trainforge.git_commit": git_commit(), "trainforge.data_checksum": data_checksum(self.task),
                "trainforge.image": os.environ.get("TRAINFORGE_IMAGE", "local"),
                **{f"trainforge.lineage.{k}": v for k, v in cfg.tracking.lineage.items()},
                **({"mlflow.parentRunId": cfg.tracking.lineage["parent_run_id"]} if "parent_run_id" in cfg.tracking.lineage else {})}
        tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, job_id=cfg.job_id, team=cfg.team, run_name=cfg.job_id,
                          params=flatten(cfg.model_dump(mode="json")), tags=tags)

        def point_at(c, _):
            pointer = {"trainforge.checkpoint.latest": str(c.path.resolve()), "trainforge.checkpoint.step": str(c.step)}
            if cfg.checkpoint.s3_uri:
                pointer["trainforge.checkpoint.s3_prefix"] = cfg.checkpoint.s3_uri.rstrip("/") + "/" + c.path.name
            tracker.set_tags(pointer)
        self.checkpoints.on_commit.append(point_at)
        return tracker

    def close(self, status: str) -> None:
        """Finish the checkpoint machinery (its staging threads and cached buffers must not outlive the process
        group or the CUDA context), then flush the side channels (S3, MLflow) before the process goes away."""
        self.checkpoints.close()
        if self.s3 is not None:
            if not self.s3.close(timeout=self.cfg.checkpoint.s3_close_timeout_s):
                log.warning("the last checkpoint did not reach S3 within %.0f s; it is on the local tier only",
                            self.cfg.checkpoint.s3_close_timeout_s)
        if self.tracker is not None:
            self.tracker.close(status, timeout=self.cfg.tracking.close_timeout_s)

    # ---- state -----------------------------------------------------------------------------------------------

    def add_eval_hook(self, hook: hooks.EvalHook) -> None:
        """Run `hook` after every evaluation (on rank 0); a stateful hook is checkpointed under its name."""
        self.eval_hooks.append(hook)

    def stateful(self) -> dict[str, hooks.Stateful]:
        """Everything checkpointed besides the model and optimizer, by name: one place to add a stateful piece."""
        pieces: dict[str, hooks.Stateful] = {"state": self.state, "scheduler": self.scheduler, "sampler": self.sampler}
        pieces |= {f"hook.{h.name}": h for h in self.eval_hooks if isinstance(h, hooks.Stateful)}
        return pieces

    def trainer_state(self) -> dict[str, Any]:
        return {name: piece.state_dict() for name, piece in self.stateful().items()}

    def load_trainer_state(self, saved: dict[str, Any]) -> None:
        for name, piece in self.stateful().items():
            if name in saved:  # a piece added since the checkpoint was written starts fresh
                piece.load_state_dict(saved[name])

    def resume(self) -> int | None:
        if self.s3 is not None:
            self.s3.sync_down(self.checkpoints.directory)
        if self.cfg.checkpoint.start_from is not None:
            problem = [None]
            if self.env.is_main:
                try:
                    start_from(self.cfg.checkpoint.start_from, self.checkpoints.directory)
                except UserError as exc:
                    problem = [str(exc)]
            dist.broadcast_object_list(problem, src=0, group=self.env.checkpoint_group)  # every rank fails alike
            if problem[0]:
                raise UserError(problem[0])
        dist.barrier(group=self.env.checkpoint_group)  # nobody scans the local tier while it is being filled
        latest = self.checkpoints.latest()
        if latest is None:
            return None
        saved, rng_restored = self.checkpoints.load(latest, self.model, self.optimizer)
        self.load_trainer_state(saved)
        self.state.restarts += 1
        self.metrics.restarts.set(self.state.restarts)
        if self.env.is_main:
            log.info("resumed from %s (step %d)%s", latest.path, latest.step, "" if rng_restored else "; new world size, RNG reseeded")
        return latest.step

    def save(self, *, blocking: bool) -> float:
        blocked = self.checkpoints.save(self.state.step, self.model, self.optimizer, self.trainer_state(),
                                        self.state.last_eval.get(self.cfg.metric), blocking=blocking)
        self.metrics.checkpoint_blocking_seconds.observe(blocked)
        return blocked

    # ---- steps -----------------------------------------------------------------------------------------------

    def _to_device(self, batch):
        return tuple(t.to(self.env.device, non_blocking=True) for t in batch)

    def train_step(self, batches) -> tuple[torch.Tensor, dict[str, int]]:
        """One optimizer step over grad_accum_steps micro-batches; returns this rank's mean loss (a device tensor: the
        host reads it only at log steps) and the samples/tokens it trained on."""
        total_loss, totals = None, {"samples": 0}
        accum = self.cfg.grad_accum_steps
        for i in range(accum):
            waited = time.perf_counter()
            batch = self._to_device(next(batches))
            self._interval.data_wait_s += time.perf_counter() - waited
            # DDP all-reduces gradients on every backward unless told not to: only the last micro-batch syncs.
            sync = i == accum - 1 or not hasattr(self.model, "no_sync")
            with (contextlib.nullcontext() if sync else self.model.no_sync()), autocast(self.cfg, self.env):
                loss, counts = self.task.loss(self.model, batch)
            scaled = loss / accum if accum > 1 else loss
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            self.sampler.advance(counts["samples"])
            total_loss = loss.detach() if total_loss is None else total_loss + loss.detach()
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
        # An async checkpoint may still be copying parameters and optimizer state: the step must not mutate them yet.
        staging_wait = self.checkpoints.wait_for_staging()
        if staging_wait:
            self.metrics.checkpoint_blocking_seconds.observe(staging_wait)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return (total_loss / accum if accum > 1 else total_loss), totals

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        n = len(self.task.eval_set)
        per_rank = n // self.env.world_size
        indices = list(range(self.env.rank * per_rank, (self.env.rank + 1) * per_rank))
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(self.task.eval_set, indices), batch_size=self.cfg.batch_size)
        sums: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(loader):
            if self.cfg.eval_batches is not None and i >= self.cfg.eval_batches:
                break
            with autocast(self.cfg, self.env):
                for k, v in self.task.eval_sums(self.model, self._to_device(batch)).items():
                    sums[k] = sums.get(k, 0) + v.detach().float()
        keys = sorted(sums)
        packed = torch.stack([sums[k] for k in keys]).to(self.env.device)
        dist.all_reduce(packed)
        self.model.train()
        return self.task.summarize({k: float(v) for k, v in zip(keys, packed.tolist())})

    # ---- the loop ----------------------------------------------------------------------------------------------

    def run(self, guard: PreemptionGuard) -> RunResult:
        """The loop. Per step the host reads nothing from the device: the loss stays there until a log step, and the
        stop agreement is a host-side collective read one step later. So every rank stops at the same step, at most
        one step after the first rank was told to stop (about two step times after SIGTERM), or at the step whose
        evaluation made rank 0's hooks decide."""
        cfg, env = self.cfg, self.env
        resumed_from = self.resume()
        batches = micro_batches(self.task.train_set, self.sampler, cfg.batch_size)
        metrics_file = open(self.output / paths.METRICS_FILE, "a") if env.is_main else None
        stopped = "max_steps"
        self.model.train()
        in_flight: _Agreement | None = None
        self._interval = _LogInterval(time.perf_counter(), self.state.step)
        try:
            while self.state.step < cfg.max_steps:
                loss, counts = self.train_step(batches)
                self.state.step += 1
                evaluating = self.state.step % cfg.eval_every == 0 or self.state.step == cfg.max_steps
                agreed = self._land(in_flight)  # the previous step's answer
                in_flight = None
                stop_code = 0
                if evaluating and not agreed.preempted:
                    stop_code = hooks.reason_code(self._after_eval(metrics_file))
                in_flight = self._agree(guard, stop_code)
                if agreed.preempted or evaluating:
                    # Read this step's answer now: a preemption stops here, and rank 0's decision after an
                    # evaluation stops every rank at this same step.
                    answer = self._land(in_flight)
                    in_flight = None
                    if agreed.preempted or answer.preempted:
                        self._log_step(loss, counts, metrics_file)
                        return self._preempted(guard, resumed_from)
                    stopped = answer.stop_reason or stopped
                last = stopped != "max_steps" or self.state.step == cfg.max_steps
                if self.state.step % cfg.log_every == 0 or last:
                    self._log_step(loss, counts, metrics_file)
                if self.state.step % cfg.checkpoint.interval_steps == 0:
                    self.save(blocking=False)
                self.checkpoints.poll()
                if stopped != "max_steps":
                    break
                if cfg.step_sleep_s:
                    time.sleep(cfg.step_sleep_s)
            self._land(in_flight)
            in_flight = None
            self.checkpoints.wait()
            if self.checkpoints.last_commit is None or self.checkpoints.last_commit.step != self.state.step:
                self.save(blocking=True)
            self._write_final_model()
            return RunResult(contract.EXIT_OK, self.state.step, self.state.last_eval, resumed_from, stopped, *self._precision_record())
        finally:
            if in_flight is not None:
                in_flight.work.wait()
            if metrics_file:
                metrics_file.close()

    def _agree(self, guard: PreemptionGuard, stop_code: int) -> _Agreement:
        """Start the step's agreement on the host: "has any rank been told to stop?" and rank 0's stop decision.
        A gloo all_reduce of two integers on its own group: it never waits for the GPU, and it runs while the next
        step computes (read in `_land` one step later, or at once after an evaluation)."""
        decision = stop_code if self.env.is_main else 0  # summed over ranks: only rank 0's counts
        values = torch.tensor([int(guard.requested.is_set()), decision], dtype=torch.int64)
        if self.env.world_size == 1:
            return _Agreement(values, _DONE)  # a world of one agrees with itself (the collective cost ~66 us a step)
        return _Agreement(values, dist.all_reduce(values, group=self.env.control_group, async_op=True))

    def _land(self, agreement: _Agreement | None) -> Agreement:
        if agreement is None:
            return Agreement()
        agreement.work.wait()
        stop, decision = agreement.values.tolist()  # a host tensor: no device synchronisation
        return Agreement(preempted=stop > 0, stop_reason=hooks.reason_of(int(decision)))

    def _log_step(self, loss: torch.Tensor, counts: dict[str, int], metrics_file) -> None:
        """The one place the host reads the loss: at log steps (and the last step). The mean over ranks, the step time
        averaged over the interval since the previous log step (measured after the read, so it includes the device's
        work), then Prometheus, the JSONL log, the console and MLflow."""
        mean = loss.detach().float().reshape(1).clone()
        dist.all_reduce(mean)
        loss_value = mean.item() / self.env.world_size
        now, step, world = time.perf_counter(), self.state.step, self.env.world_size
        interval = self._interval
        steps = max(1, step - interval.first_step)
        step_s = (now - interval.started_at) / steps
        lr = self.scheduler.get_last_lr()[0]
        m = self.metrics
        m.step.set(step)
        m.loss.set(loss_value)
        m.step_seconds.observe(step_s)  # one observation per log interval: its mean step time
        m.samples_per_second.set(counts["samples"] * world / step_s)
        if "tokens" in counts:
            m.tokens_per_second.set(counts["tokens"] * world / step_s)
        m.data_wait_seconds.inc(interval.data_wait_s)
        m.sample_gpu()
        self._interval = _LogInterval(now, step)
        if metrics_file:
            metrics_file.write(json.dumps({"step": step, "loss": loss_value, "lr": lr, "step_s": step_s, "samples": counts["samples"] * world,
                                           "t": time.time()}) + "\n")
            metrics_file.flush()
        if self.env.is_main:
            rate = 1.0 / step_s if step_s > 0 else 0.0
            eta = (self.cfg.max_steps - step) / rate if rate else 0.0
            log.info("step %d/%d  loss %.4f  lr %.2e  %.1f steps/s  %.0f samples/s  ETA %.0f s", step, self.cfg.max_steps,
                     loss_value, lr, rate, counts["samples"] * world * rate, eta)
        if self.tracker is not None:
            self.tracker.log_metrics(step, {"loss": loss_value, "lr": lr, "samples_per_second": counts["samples"] * world / step_s})

    def _after_eval(self, metrics_file) -> str | None:
        """Evaluate (every rank), then rank 0's hooks decide whether to stop; the other ranks learn it from the collective."""
        self.state.last_eval = self.evaluate()
        self.metrics.evaluated(self.state.last_eval)
        if self.tracker is not None:
            self.tracker.log_metrics(self.state.step, {f"eval_{k}": v for k, v in self.state.last_eval.items()})
        if metrics_file:
            metrics_file.write(json.dumps({"step": self.state.step, "eval": self.state.last_eval}) + "\n")
        if not self.env.is_main:
            return None
        return hooks.first_stop(self.eval_hooks, self.state.step, self.state.last_eval)

    def _preempted(self, guard: PreemptionGuard, resumed_from: int | None) -> RunResult:
        self.checkpoints.wait()
        last = self.checkpoints.last_commit
        recent = last is not None and (last.step == self.state.step or
                                       time.time() - last.committed_at <= self.cfg.checkpoint.emergency_skip_if_newer_than_s)
        if not recent:
            self.save(blocking=True)
        if self.s3 is not None and self.env.is_main and guard.received_at is not None:
            # The node's disk may vanish with it: spend what is left of the grace period getting the checkpoint out.
            left = self.cfg.checkpoint.preemption_grace_s - (time.monotonic() - guard.received_at) - 2.0
            if not self.s3.flush(max(0.0, left)):
                log.warning("emergency checkpoint not in S3 before the grace period ran out; it is on the local tier only")
        if self.env.is_main and guard.received_at is not None:
            elapsed = time.monotonic() - guard.received_at
            log.warning("preempted at step %d: %s in %.2f s after SIGTERM", self.state.step,
                        "committed checkpoint" if not recent else "recent checkpoint kept", elapsed)
            (self.output / paths.PREEMPTED_FILE).write_text(json.dumps({"step": self.state.step, "sigterm_to_commit_s": elapsed,
                                                                    "emergency_checkpoint": not recent}))
        return RunResult(contract.EXIT_PREEMPTED, self.state.step, self.state.last_eval, resumed_from, "preempted",
                         *self._precision_record())

    def _write_final_model(self) -> None:
        """Full (unsharded) parameters on rank 0, for hand-off and for tests that compare runs bit for bit."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.env.is_main:
            torch.save(full, self.output / paths.FINAL_MODEL_FILE)


def default_eval_hooks(cfg: RunConfig) -> list[hooks.EvalHook]:
    """The stop rules the run config asks for. A target reached wins over patience run out at the same evaluation."""
    out: list[hooks.EvalHook] = []
    if cfg.target_metric is not None:
        out.append(hooks.TargetMetric(cfg.metric, cfg.metric_mode, cfg.target_metric))
    if cfg.early_stopping_patience is not None:
        out.append(hooks.EarlyStopping(cfg.metric, cfg.metric_mode, cfg.early_stopping_patience))
    return out


def git_commit() -> str:
    """The code's commit: from the image (TRAINFORGE_GIT_COMMIT), else from the working tree, else unknown."""
    if os.environ.get("TRAINFORGE_GIT_COMMIT"):
        return os.environ["TRAINFORGE_GIT_COMMIT"]
    import subprocess
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
