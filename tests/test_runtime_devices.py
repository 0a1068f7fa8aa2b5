"""Device paths proven device-faithfully on the CPU (issue 38): the code that will run on CUDA run with the model and
its batches on the `meta` device, which, like CUDA, refuses to mix devices in one operation."""

from __future__ import annotations

import pytest
import torch

from trainforge.trainer.runtime import tasks
from trainforge.trainer.runtime.checkpoint_files import scan
from trainforge.trainer.runtime.loop import add_eval_sums, packed_eval_sums

META = torch.device("meta")


def on_meta(name: str):
    task = tasks.BUNDLED[name]()
    with META:
        model = task.build_model()
    batch = next(iter(torch.utils.data.DataLoader(task.eval_set, batch_size=4)))
    return task, model, tuple(t.to(META) for t in batch)


@pytest.mark.parametrize("name", sorted(tasks.BUNDLED))
def test_every_bundled_tasks_evaluation_stays_on_the_models_device_up_to_its_all_reduce(name):
    """Each sum a bundled task returns is on the batch's device (a CPU `count` beside CUDA sums was refused at the
    stack before the all-reduce: every GPU job died at its first evaluation), and the packed totals are one tensor there."""
    task, model, batch = on_meta(name)
    sums = task.eval_sums(model, batch)
    assert {key: value.device for key, value in sums.items()} == {key: META for key in sums}
    total: dict[str, torch.Tensor] = {}
    for _ in range(2):
        add_eval_sums(total, task.eval_sums(model, batch), META)
    keys, packed = packed_eval_sums(total, META)
    assert keys == sorted(sums) and packed.device == META and packed.shape == (len(keys),)


def test_a_users_task_may_return_cpu_scalars_and_floats():
    total: dict[str, torch.Tensor] = {}
    add_eval_sums(total, {"loss_sum": torch.tensor(3.0, device=META), "count": torch.tensor(4.0), "extra": 2}, META)
    keys, packed = packed_eval_sums(total, META)
    assert keys == ["count", "extra", "loss_sum"] and packed.device == META
    total = {}
    add_eval_sums(total, {"loss_sum": torch.tensor(3.0), "count": 4}, torch.device("cpu"))
    add_eval_sums(total, {"loss_sum": torch.tensor(1.0), "count": 4}, torch.device("cpu"))
    assert packed_eval_sums(total, torch.device("cpu"))[1].tolist() == [8.0, 4.0]


def test_an_async_save_reads_the_state_only_after_the_steps_device_work(tmp_path):
    """The stager copies on its own stream, which does not wait for the compute stream: the manager settles the
    device first, at every save (not only where a log step's `.item()` happened to sync). Recorded order of events."""
    import torch.distributed as dist

    from trainforge.trainer.runtime.checkpoint import CheckpointManager
    from trainforge.trainer.runtime.config import CheckpointConfig
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), interval_steps=3, async_save=True), rank=0,
                                    world_size=1, metric_mode="min", process_group=dist.new_group(backend="gloo"))
        events: list[str] = []
        manager.settle = lambda: events.append("settle")
        stager = manager._async_stager()
        staged = stager.stage

        def recorded(state, *args, **kwargs):
            events.append("stage")
            return staged(state, *args, **kwargs)
        stager.stage = recorded
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        for step in (3, 5):  # any step, at any cadence
            manager.save(step, model, optimizer, {"step": step}, None, blocking=False)
            manager.wait()
        manager.close()
        assert events == ["settle", "stage", "settle", "stage"]
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000003", "step-00000005"]
    finally:
        dist.destroy_process_group()


def test_a_stager_that_closes_itself_after_staging_is_replaced_for_the_next_save(tmp_path, monkeypatch):
    """torch 2.11's DefaultStager closes its StateDictStager after each stage (emptying its copy dispatch), so the
    second async checkpoint through the same stager died with `KeyError: <class 'type'>` on an H200 (gpu-check stage E).
    Played here by making the stager close itself the way that torch does; every save must still commit."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.staging import DefaultStager

    from trainforge.trainer.runtime.checkpoint import CheckpointManager
    from trainforge.trainer.runtime.config import CheckpointConfig
    staged = DefaultStager._stage

    def stage_then_close(self, state_dict, **kwargs):
        try:
            return staged(self, state_dict, **kwargs)
        finally:
            self._state_dict_stager.close()
    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), interval_steps=1, keep_last=5,
                                                     async_save=True),
                                    rank=0, world_size=1, metric_mode="min", process_group=dist.new_group(backend="gloo"))
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters())
        for step in (1, 2, 3):
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            manager.save(step, model, optimizer, {"step": step}, None, blocking=False)
            manager.wait()
        manager.close()
        assert [c.step for c in scan(tmp_path / "ckpt")[0]] == [1, 2, 3]
    finally:
        dist.destroy_process_group()


def test_deterministic_defaults_to_what_the_device_can_honour():
    from trainforge.trainer.runtime.distributed import resolve_deterministic
    assert resolve_deterministic(None, torch.device("cpu"))[0] is True, "bit-identical resume on the CPU, where it is free"
    on_cuda, why = resolve_deterministic(None, torch.device("cuda", 0))
    assert on_cuda is False and "deterministic: true" in why, "off on CUDA, saying how to turn it on"
    assert resolve_deterministic(True, torch.device("cuda", 0)) == (True, "as configured")
    assert resolve_deterministic(False, torch.device("cpu")) == (False, "as configured")


# ---- FSDP2: built on meta, initialised module by module, mixed precision on every unit --------------------------

@pytest.fixture
def world_of_one():
    """A real gloo process group of one (the runtime's Distributed, made as init_distributed makes it)."""
    import torch.distributed as dist

    from trainforge.trainer.runtime.distributed import Distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield Distributed(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                          checkpoint_group=dist.new_group(backend="gloo"), control_group=dist.new_group(backend="gloo"))
    finally:
        dist.destroy_process_group()


def fsdp_config(**more):
    from trainforge.trainer.runtime.config import RunConfig
    return RunConfig.model_validate({"strategy": "fsdp", "task": "char_lm", **more})


@pytest.mark.parametrize("chosen,param_dtype", [("bf16", torch.bfloat16), ("fp32", None)])
def test_every_fsdp_unit_computes_in_the_runs_precision_and_reduces_in_fp32(world_of_one, chosen, param_dtype):
    from trainforge.trainer.runtime import build
    task = tasks.BUNDLED["char_lm"]()
    model, memory = build.build_model(task, fsdp_config(), world_of_one, chosen)
    units = [*task.fsdp_units(model), model]  # type: ignore[misc]  # the bundled LM names its units
    for unit in units:
        policy = unit._get_fsdp_state()._mp_policy
        assert (policy.param_dtype, policy.reduce_dtype) == (param_dtype, torch.float32), unit
    assert model._get_fsdp_state()._mp_policy.output_dtype == torch.float32, "the loss reads fp32 logits"
    assert memory.materialised == "meta"
    assert all(p.device.type == "cpu" for p in model.parameters()), "nothing left on meta"
    x, _ = next(iter(torch.utils.data.DataLoader(task.eval_set, batch_size=2)))
    assert model(x).dtype == torch.float32


def test_the_meta_build_initialises_the_same_weights_whatever_the_world_size(world_of_one):
    """Seeded per module by name: a world of one gets the full tensors a sharded world assembles (the two-rank case is
    test_runtime's FSDP resume and memory tests), and a second build gives the same bits."""
    from trainforge.trainer.runtime import build
    task = tasks.BUNDLED["char_lm"]()
    first, _ = build.build_model(task, fsdp_config(seed=3), world_of_one, "fp32")
    second, _ = build.build_model(task, fsdp_config(seed=3), world_of_one, "fp32")
    other_seed, _ = build.build_model(task, fsdp_config(seed=4), world_of_one, "fp32")
    full = {n: p.full_tensor() for n, p in first.named_parameters()}
    assert all(torch.equal(full[n], p.full_tensor()) for n, p in second.named_parameters())
    assert not torch.equal(full["embed.weight"], dict(other_seed.named_parameters())["embed.weight"].full_tensor())
    causal = dict(first.named_buffers())["causal"]
    assert torch.equal(causal, torch.nn.Transformer.generate_square_subsequent_mask(causal.shape[0])), "buffers rebuilt too"
    blocks = [full[f"blocks.layers.{i}.linear1.weight"] for i in range(2)]
    assert not torch.equal(blocks[0], blocks[1]), "each module its own draw"
    assert 0.01 < float(full["position"].std()) < 0.03, "the task's own init (normal, 0.02)"


def test_a_module_without_an_initialiser_is_named_with_the_fix(world_of_one):
    from trainforge.trainer.runtime import build
    from trainforge.trainer.runtime.config import UserError

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.gain
    task = tasks.BUNDLED["classifier"]()
    task.build_model = lambda: torch.nn.Sequential(torch.nn.Linear(32, 4), Scale())
    with pytest.raises(UserError, match=r"module '1' \(Scale\) .* no reset_parameters\(\)\. Fix"):
        build.build_model(task, fsdp_config(task="classifier"), world_of_one, "fp32")


# ---- NCCL: fail fast, say where ------------------------------------------------------------------------------

def test_nccl_error_handling_and_the_flight_recorder_reach_the_process_group_environment(tmp_path, monkeypatch):
    """ProcessGroupNCCL reads these at its creation: init_distributed sets them (what the launch environment already
    says wins) before it makes the group, the flight recorder's dump in the run directory."""
    from trainforge.trainer.runtime.config import NcclConfig, nccl_environment
    from trainforge.trainer.runtime.distributed import init_distributed, leave_distributed
    cfg = NcclConfig(timeout_s=120, startup_timeout_s=900, flight_recorder_entries=500)
    expected = nccl_environment(cfg, str(tmp_path))
    for name in expected:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")  # an operator's own setting stays
    for deprecated in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.delenv(deprecated, raising=False)
    env = init_distributed(cfg, str(tmp_path))
    try:
        import os
        assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
        assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl-flight-recorder-rank")
        assert os.environ["TORCH_FR_BUFFER_SIZE"] == "500"
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ, "torch 2.13 warns in every process for its deprecated alias"
    finally:
        leave_distributed(env, clean=True)
    off = nccl_environment(NcclConfig(flight_recorder_entries=0), "/run")
    assert off["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0" and expected["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_an_efa_pod_without_the_ofi_plugin_is_refused_with_the_fix(tmp_path):
    from trainforge.trainer.runtime.distributed import ofi_plugin_problem
    assert ofi_plugin_problem({"LD_LIBRARY_PATH": ""}) is None, "no EFA devices: sockets are what NCCL should use"
    problem = ofi_plugin_problem({"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": f"{tmp_path}:/nonexistent"})
    assert problem is not None and "aws-ofi-nccl" in problem and "Fix:" in problem
    (tmp_path / "libnccl-net-ofi.so").write_bytes(b"")
    assert ofi_plugin_problem({"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": f"/nonexistent:{tmp_path}"}) is None


def limits_with_memlock(soft: str, hard: str) -> str:
    """/proc/self/limits as the kernel writes it, with this locked-memory line."""
    return ("Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max open files            65536                1048576              files     \n"
            f"Max locked memory         {soft:<20} {hard:<20} bytes     \n")


def test_an_efa_pod_that_cannot_lock_memory_is_refused_with_the_fix():
    """The kernel's default 8 MiB would fail libfabric's EFA provider later with an opaque -12; the runtime says so
    first. This machine's own limits read too (no EFA here: nothing to refuse)."""
    from pathlib import Path

    from trainforge.trainer.runtime.distributed import memlock_problem
    efa = {"FI_PROVIDER": "efa"}
    problem = memlock_problem(efa, limits_with_memlock("8388608", "8388608"))
    assert problem is not None and "8192 KiB" in problem and "Fix:" in problem
    assert memlock_problem(efa, limits_with_memlock("unlimited", "unlimited")) is None
    assert memlock_problem(efa, limits_with_memlock(str(64 * 2**30), "unlimited")) is None
    assert memlock_problem({}, limits_with_memlock("8388608", "8388608")) is None, "no EFA devices: nothing is pinned"
    assert memlock_problem({}, Path("/proc/self/limits").read_text()) is None


def test_efa_nodes_give_containers_unlimited_locked_memory():
    """The EFA groups' nodeadm config sets the containers' rlimits (memlock unlimited, nodeadm's open-files limit kept);
    other groups keep the AMI's."""
    import base64
    import email

    import yaml

    from trainforge.infra.nodegroups import UNLIMITED, nodeadm_user_data
    from trainforge.stackconfig import NodeGroupConfig
    efa = NodeGroupConfig(name="p5", instance_types=["p5.48xlarge"], capacity="on-demand", min_size=0, max_size=2, efa=True,
                          availability_zone="us-east-1a")
    message = email.message_from_bytes(base64.b64decode(nodeadm_user_data(efa)))
    (part,) = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    rlimits = {r["type"]: r for r in yaml.safe_load(part.get_payload(decode=True))["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]}
    assert rlimits["RLIMIT_MEMLOCK"]["soft"] == rlimits["RLIMIT_MEMLOCK"]["hard"] == UNLIMITED == 2**64 - 1
    assert rlimits["RLIMIT_NOFILE"] == {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
    plain = NodeGroupConfig(name="cpu", instance_types=["m6i.4xlarge"], capacity="on-demand", min_size=0, max_size=2)
    assert nodeadm_user_data(plain) is None


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_recomputes_per_unit_and_trains_the_same_numbers(world_of_one, mode):
    """Per FSDP unit (the LM's blocks): the unit's forward runs again in backward, the gradients are the same bits as
    without it, and the parameter names (so checkpoints) do not change."""
    from trainforge.trainer.runtime import build
    task = tasks.BUNDLED["char_lm"]()
    x, y = next(iter(torch.utils.data.DataLoader(task.train_set, batch_size=4)))
    grads, names = {}, {}
    for setting in ("none", mode):
        model, _ = build.build_model(task, fsdp_config(activation_checkpointing=setting), world_of_one, "fp32")
        units = task.fsdp_units(model)  # type: ignore[misc]
        calls: list[torch.nn.Module] = []
        for unit in units:  # a child of each unit: it runs again when its unit's forward is recomputed
            unit.linear1.register_forward_pre_hook(lambda module, args, calls=calls: calls.append(module))
        loss, _ = task.loss(model, (x, y))
        assert len(calls) == len(units)
        loss.backward()
        assert len(calls) == (len(units) if setting == "none" else 2 * len(units)), (setting, len(calls))
        assert all(getattr(u.forward, "activation_checkpointing", "none") == setting for u in units)
        grads[setting] = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        names[setting] = [n for n, _ in model.named_parameters()]
    assert names["none"] == names[mode], "checkpoints keep their keys"
    assert all(torch.equal(grads["none"][n], grads[mode][n]) for n in grads["none"]), "recomputation changes no bit"


# ---- MFU ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device_name,tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H200", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA B200", 2250.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("NVIDIA A10G", 70.0), ("NVIDIA T4", None),
])
def test_each_gpu_gets_its_own_peak(device_name, tflops):
    from trainforge import catalog
    peak = catalog.peak_bf16_flops(device_name)
    assert (peak / 1e12 if peak else None) == tflops
    assert {row.gpu_model for row in catalog.CATALOG.values()} <= set(catalog.PEAK_BF16_TFLOPS), "every GPU offered has a peak"


def test_the_mfu_gauge_is_the_models_training_flops_over_the_gpus_peak():
    from trainforge.trainer.runtime.metrics import RuntimeMetrics, model_flops_utilisation
    task = tasks.BUNDLED["char_lm"]()
    model = task.build_model()
    parameters = sum(p.numel() for p in model.parameters())
    per_token = task.flops_per_token(model)  # type: ignore[misc]
    assert per_token == 6 * parameters + 6 * 2 * 128 * 64, "6N plus attention (layers 2, dim 128, context 64)"
    metrics = RuntimeMetrics(job="j", team="t", rank=0)
    metrics.configure_mfu(per_token, "NVIDIA H100 80GB HBM3", gpus=8)
    metrics.logged(10, 1.0, 0.5, {"samples": 64, "tokens": 4_000_000}, 0.0)
    expected = model_flops_utilisation(8_000_000, per_token, 8 * 989.4e12)
    labels = {"job": "j", "team": "t", "rank": "0"}
    assert metrics.registry.get_sample_value("trainforge_mfu", labels) == pytest.approx(expected) and 0 < expected < 1
    cpu = RuntimeMetrics(job="j", team="t", rank=0)
    cpu.configure_mfu(per_token, None, gpus=1)  # no GPU: no MFU reported
    cpu.logged(10, 1.0, 0.5, {"samples": 64, "tokens": 1000}, 0.0)
    assert cpu.registry.get_sample_value("trainforge_mfu", labels) == 0.0


# ---- a pod given GPUs that CUDA does not see; GPU hardware errors ------------------------------------------------

def test_a_pod_given_gpus_its_cuda_does_not_see_stops_instead_of_training_on_the_cpu():
    from trainforge.trainer.runtime.config import DeviceFault, UserError
    from trainforge.trainer.runtime.distributed import gpu_problem
    assert gpu_problem(8, "12.8", 8, "", "node-a") is None
    assert gpu_problem(0, None, 0, "", "") is None, "a CPU pod"
    no_cuda = gpu_problem(8, None, 0, "", "node-a")
    assert isinstance(no_cuda, UserError) and "built without CUDA" in str(no_cuda) and "Fix:" in str(no_cuda), "the image's"
    for said in ["The NVIDIA driver on your system is too old (found version 12040)", "Error 803: system has unsupported "
                 "display driver / cuda driver combination"]:
        newer = gpu_problem(8, "13.0", 0, said, "ip-10-0-1-7")
        assert isinstance(newer, UserError) and "Fix:" in str(newer), f"{said}: the image's CUDA is newer than the node's driver"
    fabric = gpu_problem(8, "12.8", 0, "Error 802: system not yet initialized", "ip-10-0-1-7")
    assert isinstance(fabric, DeviceFault), "the node's fault: retried"
    assert "ip-10-0-1-7" in str(fabric) and "Error 802" in str(fabric) and "kubectl cordon ip-10-0-1-7" in str(fabric)
    assert isinstance(gpu_problem(8, "12.8", 7, "", "ip-10-0-1-7"), DeviceFault), "a GPU gone of eight"


@pytest.mark.slow
def test_a_worker_told_it_has_a_gpu_on_a_torch_without_cuda_exits_as_a_user_error_naming_the_fix(tmp_path):
    """The real runtime under the node launcher, on this machine's CPU build of torch, in a pod that says it was given a
    GPU: it stops before training (no step, no checkpoint), and the job fails with the reason, not retried."""
    import os

    from support.training import run

    from trainforge import contract, exits
    done = run(tmp_path, nproc=1, check=False, env={**os.environ, contract.GPUS_PER_NODE_ENV: "1"})
    assert done.returncode == exits.EXIT_USER_ERROR, done.stderr[-3000:]
    assert "user error, not retried: rank 0: this pod was given 1 GPU(s) but its torch" in done.stderr
    assert "built without CUDA" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "ckpt").exists()


def cuda_error(code: int, words: str) -> BaseException:
    """torch.AcceleratorError as torch's C++ error translation makes it: the message, and the cudaError_t as
    `error_code` (torch/csrc/Exceptions.cpp, _new_accelerator_error_object)."""
    error = torch.AcceleratorError(f"CUDA error: {words}\nCUDA kernel errors might be asynchronously reported at some "
                                   "other API call, so the stacktrace below might be incorrect.")
    error.error_code = code  # type: ignore[attr-defined]  # set by torch's C++ side, as here
    return error


def test_the_gpus_hardware_errors_are_retried_and_the_jobs_own_kernel_errors_are_not():
    from trainforge import exits
    from trainforge.trainer.runtime.__main__ import exit_code_for
    from trainforge.trainer.runtime.config import DeviceFault

    for code, words in [(214, "uncorrectable ECC error encountered"), (220, "uncorrectable NVLink error detected during the execution"),
                        (802, "system not yet initialized"), (999, "unknown error")]:
        assert exit_code_for(cuda_error(code, words)) == exits.EXIT_DEVICE_FAULT, words
        assert exit_code_for(RuntimeError(f"NCCL watchdog: CUDA error: {words}")) == exits.EXIT_DEVICE_FAULT, "by its words"
    for code, words in [(700, "an illegal memory access was encountered"), (710, "device-side assert triggered"),
                        (719, "unspecified launch failure")]:
        assert exit_code_for(cuda_error(code, words)) == 1, f"{words}: the job's own kernels can do this"
    assert exit_code_for(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == 1, "a batch too big"
    assert exit_code_for(DeviceFault("this pod was given 8 GPU(s) ...")) == exits.EXIT_DEVICE_FAULT
    assert exit_code_for(RuntimeError("my kernel: CUDA error code 214 in my own message")) == 1


def test_a_gpu_or_peer_failure_inside_a_checkpoints_save_is_still_that_failure():
    """DCP gathers each rank's failure into a CheckpointException (a BaseException, not a RuntimeError); an error
    raised while handling another keeps it as its context."""
    from torch.distributed.checkpoint.api import CheckpointException

    from trainforge import exits
    from trainforge.trainer.runtime.__main__ import exit_code_for
    ecc = cuda_error(214, "uncorrectable ECC error encountered")
    assert exit_code_for(CheckpointException("save failed", {1: (ecc, None)})) == exits.EXIT_DEVICE_FAULT
    reset = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert exit_code_for(CheckpointException("save failed", {0: (reset, None)})) == exits.EXIT_PEER_LOST
    assert exit_code_for(CheckpointException("save failed", {0: (OSError(28, "No space left on device"), None)})) == 1
    try:
        try:
            raise ecc
        except RuntimeError as gpu:
            raise ValueError("could not read the batch") from gpu
    except ValueError as wrapped:
        assert exit_code_for(wrapped) == exits.EXIT_DEVICE_FAULT
    assert exits.is_retryable(exits.EXIT_DEVICE_FAULT)
    assert len({exits.EXIT_DEVICE_FAULT, exits.EXIT_PEER_LOST, exits.EXIT_SERVICES_DOWN, exits.EXIT_PREEMPTED,
                exits.EXIT_WORKER_LOST}) == 5, "each reason its own code"


def test_a_node_whose_rank_lost_its_gpu_is_retried(tmp_path):
    """The rank whose GPU failed records 202; torchrun then stops its peers, which record 143: a retry, counted."""
    from trainforge import exits
    from trainforge.trainer.launch import classify
    (tmp_path / "rank0.code").write_text(str(exits.EXIT_PREEMPTED))
    (tmp_path / "rank1.code").write_text(str(exits.EXIT_DEVICE_FAULT))
    assert classify(1, tmp_path, 2) == (exits.Outcome.RETRY, exits.EXIT_DEVICE_FAULT)
