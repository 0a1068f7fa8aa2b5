"""Device paths proven device-faithfully on the CPU (issue 38): the code that will run on CUDA run with the model and
its batches on the `meta` device, which, like CUDA, refuses to mix devices in one operation."""

from __future__ import annotations

import pytest
import torch

from trainforge.trainer.runtime import tasks
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


def test_deterministic_defaults_to_what_the_device_can_honour():
    from trainforge.trainer.runtime.distributed import resolve_deterministic
    assert resolve_deterministic(None, torch.device("cpu"))[0] is True, "bit-identical resume on the CPU, where it is free"
    on_cuda, why = resolve_deterministic(None, torch.device("cuda", 0))
    assert on_cuda is False and "deterministic: true" in why, "off on CUDA, saying how to turn it on"
    assert resolve_deterministic(True, torch.device("cuda", 0)) == (True, "as configured")
    assert resolve_deterministic(False, torch.device("cpu")) == (False, "as configured")
